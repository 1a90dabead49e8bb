package pin

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/internal/sys"
)

// idleMonitor is the monitor idle now, or nil.
func idleMonitor() *ebpfMon {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	return idle.mon
}

// ebpfCache returns a cache running the eBPF monitor, or skips t.
func ebpfCache(t *testing.T) *Cache {
	t.Helper()
	c := newCache(t, nil)
	if rep := c.Monitor(); rep.Kind != MonitorEBPF {
		t.Skipf("monitor %v: idle monitors are eBPF's", rep)
	}
	return c
}

// wantDetached fails t unless m's probes are detached and its maps
// released.
func wantDetached(t *testing.T, m *ebpfMon) {
	t.Helper()
	if _, err := m.m.Sync(func(bpfmon.Event) {}, nil); !errors.Is(err, bpfmon.ErrClosed) {
		t.Errorf("the monitor still runs (Sync: %v)", err)
	}
}

// TestIdleMonitorAdopted: a closed cache's eBPF monitor stays loaded,
// watching nothing, and the next cache adopts it as New returns — no
// background load, no window of uncached foreign memory — and caches and
// invalidates through it as through its own. A cache closed while its
// load still ran leaves the loaded monitor idle too.
func TestIdleMonitorAdopted(t *testing.T) {
	closeIdle(t)
	c0, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	// A registration of foreign memory starts the load (startAuto).
	at, b := mapAnon(t, 1)
	h, err := c0.Register(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	c0.Deregister(h)
	munmap(t, at, 1)
	if err := c0.Close(); err != nil { // most likely during the load
		t.Fatal(err)
	}
	loaded := idleMonitor()
	c1 := ebpfCache(t)
	if loaded == nil {
		t.Fatal("a cache closed during its monitor's load left no idle monitor")
	}
	if c1.mon != loaded {
		t.Fatal("the second cache loaded a monitor of its own instead of adopting the idle one")
	}
	if idleMonitor() != nil {
		t.Fatal("the adopted monitor is still idle")
	}

	base := uintptr(0x50_0000_0000)
	if _, err := sys.MmapAnon(base, 4*page, sys.MapFixedNoreplace); err != nil {
		t.Fatalf("mmap at %#x: %v", base, err)
	}
	defer sys.MunmapRange(base, 4*page)
	e1 := cachedRegion(t, c1, base, 1)
	wantHit(t, c1, base, 1, e1)
	m := c1.mon.(*ebpfMon)
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if idleMonitor() != m {
		t.Fatal("the closed cache's monitor is not idle")
	}
	if n := len(m.set); n != 0 {
		t.Fatalf("the idle monitor still watches %d granules", n)
	}

	c2 := newCache(t, nil)
	if !c2.monitorReady() {
		t.Fatal("the third cache's monitor not ready as New returns: it did not adopt the idle one")
	}
	if rep := c2.CurrentMonitor(); rep.Kind != MonitorEBPF || rep.Starting || c2.mon != m {
		t.Fatalf("the third cache reports %v, its monitor the idle one: %v", rep, c2.mon == m)
	}
	// The first region changed while nobody cached it; the adopting cache
	// caches foreign memory at once and sees it change.
	munmap(t, base, 2)
	if _, err := sys.MmapAnon(base, 2*page, sys.MapFixedNoreplace); err != nil {
		t.Fatalf("mmap again: %v", err)
	}
	e2 := cachedRegion(t, c2, base+page, 1)
	wantHit(t, c2, base+page, 1, e2)
	munmap(t, base+page, 1)
	if _, err := sys.MmapAnon(base+page, page, sys.MapFixedNoreplace); err != nil {
		t.Fatalf("mmap again: %v", err)
	}
	wantMiss(t, c2, base+page, 1, e2)
}

// TestIdleMonitorExpires: an idle monitor nobody adopts is detached when
// its linger ends, and the next cache loads a new one.
func TestIdleMonitorExpires(t *testing.T) {
	closeIdle(t)
	c := ebpfCache(t)
	m := c.mon.(*ebpfMon)
	expired := make(chan struct{}, 1)
	hook := func() {
		select {
		case expired <- struct{}{}:
		default:
		}
	}
	testHookIdleExpired.Store(&hook)
	defer testHookIdleExpired.Store(nil)
	defer SetIdleMonitorLinger(SetIdleMonitorLinger(time.Millisecond))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-expired:
	case <-time.After(time.Minute):
		t.Fatal("the idle monitor was not closed a minute after its 1 ms linger")
	}
	if idleMonitor() != nil {
		t.Fatal("a monitor is still idle after the linger")
	}
	wantDetached(t, m)
	c2 := newCache(t, nil)
	if c2.mon == m {
		t.Fatal("a new cache adopted the expired monitor")
	}
}

// TestIdleMonitorNone: with no linger a closed cache detaches its monitor,
// and setting none closes the one idle now.
func TestIdleMonitorNone(t *testing.T) {
	closeIdle(t)
	c1 := ebpfCache(t)
	m1 := c1.mon.(*ebpfMon)
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if idleMonitor() != m1 {
		t.Fatal("the closed cache's monitor is not idle")
	}
	prev := SetIdleMonitorLinger(0)
	defer SetIdleMonitorLinger(prev)
	if idleMonitor() != nil {
		t.Fatal("a monitor is still idle after SetIdleMonitorLinger(0)")
	}
	wantDetached(t, m1)
	c2 := ebpfCache(t)
	m2 := c2.mon.(*ebpfMon)
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	if idleMonitor() != nil {
		t.Fatal("a cache closed with no linger left its monitor idle")
	}
	wantDetached(t, m2)
}

// TestStaleHitAcrossAdoptions: caches created and closed in turn, each
// after the first adopting the monitor the last one left, while
// goroutines register foreign memory, unmap it and map it again: no
// cache ever serves memory that changed by an entry from before the
// change, and each caches foreign memory through the adopted monitor.
func TestStaleHitAcrossAdoptions(t *testing.T) {
	closeIdle(t)
	first := ebpfCache(t)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	const cycles, goroutines, iters = 10, 2, 200
	for cycle := range cycles {
		c, err := New(nil)
		if err != nil {
			t.Fatal(err)
		}
		if !c.monitorReady() {
			c.Close()
			t.Fatalf("cycle %d: the idle monitor was not adopted", cycle)
		}
		var stale, hits atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			at := uintptr(0x60_0000_0000) + uintptr(g)<<21
			p, err := sys.MmapAnon(at, page, sys.MapFixedNoreplace)
			if err != nil {
				t.Fatalf("mmap at %#x: %v", at, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer sys.MunmapRange(at, page)
				b := sys.Bytes(p, page)
				for range iters {
					last, hit, ok := registerTwice(t, c, b)
					if !ok {
						return
					}
					if hit {
						hits.Add(1)
					}
					if b, ok = remapRegister(t, c, at, last, &stale); !ok {
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if stale.Load() != 0 {
			t.Fatalf("cycle %d: %d stale hits", cycle, stale.Load())
		}
		if hits.Load() != goroutines*iters {
			t.Fatalf("cycle %d: %d of %d registrations of unchanged foreign memory hit", cycle, hits.Load(), goroutines*iters)
		}
	}
}
