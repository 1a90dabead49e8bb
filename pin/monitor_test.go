package pin

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

func (c *Cache) monitorReady() bool {
	select {
	case <-c.monReady:
		return true
	default:
		return false
	}
}

// registerTwice registers b and deregisters it, twice, and returns the
// second registration's entry and whether it was the first's (a hit).
// ok is false when a registration failed (t is told).
func registerTwice(t *testing.T, c *Cache, b []byte) (second uint64, hit, ok bool) {
	h1, err := c.Register(b, 0)
	if err != nil {
		t.Error(err)
		return 0, false, false
	}
	c.Deregister(h1)
	h2, err := c.Register(b, 0)
	if err != nil {
		t.Error(err)
		return 0, false, false
	}
	c.Deregister(h2)
	return h2.entryID(), h2.entryID() == h1.entryID(), true
}

// remapRegister unmaps the page at at, maps a fresh one there and
// registers it, and counts in stale a registration that the entry old
// served (a stale hit). It returns the new page. ok is false when a step
// failed (t is told).
func remapRegister(t *testing.T, c *Cache, at uintptr, old uint64, stale *atomic.Int64) (b []byte, ok bool) {
	if err := sys.MunmapRange(at, page); err != nil {
		t.Error(err)
		return nil, false
	}
	q, err := sys.MmapAnon(at, page, sys.MapFixedNoreplace)
	if err != nil {
		t.Errorf("mmap at %#x again: %v", at, err)
		return nil, false
	}
	b = sys.Bytes(q, page)
	h, err := c.Register(b, 0)
	if err != nil {
		t.Error(err)
		return nil, false
	}
	c.Deregister(h)
	if h.entryID() == old {
		stale.Add(1)
	}
	return b, true
}

// TestAutoStartsAtForeignMemory: MonitorAuto's monitor does not start
// while the cache registers only memory of Alloc; the first registration
// of foreign memory starts it, in the background.
func TestAutoStartsAtForeignMemory(t *testing.T) {
	closeIdle(t) // a fresh start, not an idle monitor's adoption
	c := newCache(t, nil)
	waits := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.autoWaits
	}
	owned, err := Alloc(4 * int(page))
	if err != nil {
		t.Fatal(err)
	}
	defer Free(owned)
	for range 3 {
		h, err := c.Register(owned, 0)
		if err != nil {
			t.Fatal(err)
		}
		c.Deregister(h)
	}
	if !waits() || c.monitorReady() {
		t.Fatalf("the monitor started for registrations of Alloc's memory alone (%v)", c.CurrentMonitor())
	}
	if rep := c.CurrentMonitor(); rep.Kind != MonitorOwned || !rep.Starting {
		t.Fatalf("before the monitor starts: %v, want %v starting", rep, MonitorOwned)
	}
	addr, foreign := mapAnon(t, 1)
	defer munmap(t, addr, 1)
	h, err := c.Register(foreign, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Deregister(h)
	if waits() {
		t.Fatal("a registration of foreign memory did not start the monitor")
	}
	if rep := c.Monitor(); rep.Starting {
		t.Fatalf("Monitor() = %v: still starting", rep)
	}
}

// TestStaleHitAutoWindow runs registrations of foreign memory from the
// moment New returns, while MonitorAuto's monitor starts in the
// background, and on after it is adopted. Before it is adopted foreign
// memory must not be cached at all (a second Register of unchanged memory
// misses); after, it must be (a hit), and at no time may memory that was
// unmapped and mapped again be served by its old entry.
func TestStaleHitAutoWindow(t *testing.T) {
	closeIdle(t) // a fresh load, not an idle monitor's adoption
	c := newCache(t, nil)
	if c.monitorReady() {
		t.Fatal("MonitorAuto's monitor ready as New returns: the start is not in the background")
	}
	const goroutines = 2
	const after = 2000 // iterations each once the monitor is adopted
	var inWindow, cachedInWindow, stale, afterHits atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		at := uintptr(0x30_0000_0000) + uintptr(g)<<21
		p, err := sys.MmapAnon(at, page, sys.MapFixedNoreplace)
		if err != nil {
			t.Fatalf("mmap at %#x: %v", at, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer sys.MunmapRange(at, page)
			b := sys.Bytes(p, page)
			for n := 0; n < after; {
				readyBefore := c.monitorReady()
				last, hit, ok := registerTwice(t, c, b)
				if !ok {
					return
				}
				switch {
				case !c.monitorReady():
					inWindow.Add(1)
					if hit {
						cachedInWindow.Add(1)
					}
				case readyBefore:
					n++
					if hit {
						afterHits.Add(1)
					}
				}
				if b, ok = remapRegister(t, c, at, last, &stale); !ok {
					return
				}
			}
		}()
	}
	wg.Wait()
	rep := c.Monitor()
	t.Logf("monitor %v; %d iterations before it was adopted, %d hits in %d after", rep, inWindow.Load(), afterHits.Load(), goroutines*after)
	if stale.Load() != 0 {
		t.Errorf("%d stale hits", stale.Load())
	}
	if cachedInWindow.Load() != 0 {
		t.Errorf("%d of %d registrations of foreign memory cached before the monitor was adopted", cachedInWindow.Load(), inWindow.Load())
	}
	if rep.Kind == MonitorEBPF || rep.Kind == MonitorUserfaultfd {
		if inWindow.Load() == 0 {
			t.Errorf("no iteration ran before the %v monitor was adopted", rep.Kind)
		}
		if afterHits.Load() == 0 {
			t.Errorf("foreign memory never cached after the %v monitor was adopted", rep.Kind)
		}
	}
}

// TestCloseDuringBackgroundStart: Close while MonitorAuto's monitor is
// still starting waits for it and releases it (the leak check of TestMain
// sees its fds otherwise).
func TestCloseDuringBackgroundStart(t *testing.T) {
	for range 3 {
		closeIdle(t) // a fresh load, not an idle monitor's adoption
		c, err := New(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if !c.monitorReady() {
			t.Fatal("Close returned before the background start finished")
		}
	}
}

// TestUncachedReleaseKeepsGranuleWatched: a foreign registration made
// before the monitor was adopted is uncached; when it is released after a
// cached entry has come into the same 2 MiB granule, the granule must stay
// watched, or the cached entry would survive its munmap.
func TestUncachedReleaseKeepsGranuleWatched(t *testing.T) {
	closeIdle(t) // a fresh load, not an idle monitor's adoption
	c := newCache(t, nil)
	base := uintptr(0x40_0000_0000)
	if _, err := sys.MmapAnon(base, 8*page, sys.MapFixedNoreplace); err != nil {
		t.Fatalf("mmap at %#x: %v", base, err)
	}
	defer sys.MunmapRange(base, 8*page)
	u := register(t, c, sys.Bytes(base, page), 0)
	if c.monitorReady() {
		deregister(t, c, u)
		t.Skip("the monitor was adopted before the first registration")
	}
	if rep := c.Monitor(); rep.Kind != MonitorEBPF {
		deregister(t, c, u)
		t.Skipf("monitor %v: the granule case is eBPF's", rep)
	}
	old := cachedRegion(t, c, base+4*page, 1)
	wantHit(t, c, base+4*page, 1, old)
	deregister(t, c, u) // unpins the uncached page: the granule stays watched
	munmap(t, base+4*page, 1)
	if _, err := sys.MmapAnon(base+4*page, page, sys.MapFixedNoreplace); err != nil {
		t.Fatalf("mmap again: %v", err)
	}
	wantMiss(t, c, base+4*page, 1, old)
}

// TestMonitorLoadPriority: MonitorAuto's background load runs at nice 19
// where the process may raise it back, and its thread has its old
// priority back once the monitor is ready — it serves other goroutines
// after, and is not ended (which would kill children started from it
// with a parent-death signal).
func TestMonitorLoadPriority(t *testing.T) {
	// The priority threads have here, the loader's before it lowered its
	// own: this goroutine's thread's, held so that the load cannot run
	// on it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	base := taskNice(t, sys.Gettid())
	type seen struct{ tid, nice int }
	got := make(chan seen, 1)
	hook := func(tid int) {
		select {
		case got <- seen{tid, taskNice(t, tid)}:
		default: // only the first load is kept
		}
	}
	testHookNiceLoad.Store(&hook)
	defer testHookNiceLoad.Store(nil)
	closeIdle(t) // a fresh load, not an idle monitor's adoption
	c := newCache(t, nil)
	c.Monitor() // the load is over
	var s seen
	select {
	case s = <-got:
	default:
		t.Skip("the process may not raise a thread's priority back: the load runs at its own")
	}
	if s.nice != 19 {
		t.Fatalf("the loading thread's nice during the load = %d, want 19", s.nice)
	}
	if n := taskNice(t, s.tid); n != base {
		t.Fatalf("the loading thread %d is at nice %d once the monitor is ready, want %d as before", s.tid, n, base)
	}
}

// taskNice is sys.ThreadNice, failing the test on an error (a thread
// that ended among them).
func taskNice(t *testing.T, tid int) int {
	t.Helper()
	n, err := sys.ThreadNice(tid)
	if err != nil {
		t.Fatalf("thread %d: %v", tid, err)
	}
	return n
}

// TestMonitorLoadGarbageFreed: MonitorAuto's background eBPF load parses
// the kernel's BTF, megabytes that the load drops; once the monitor is
// adopted they are given back to the system, and the process's resident
// Go memory is about what it was before the load.
func TestMonitorLoadGarbageFreed(t *testing.T) {
	ebpfMonitor(t) // skips where eBPF cannot run
	closeIdle(t)   // a fresh load, not an idle monitor's adoption
	freed := make(chan struct{}, 1)
	hook := func() {
		select {
		case freed <- struct{}{}:
		default:
		}
	}
	testHookLoadFreed.Store(&hook)
	defer testHookLoadFreed.Store(nil)
	debug.FreeOSMemory()
	before := residentGo()
	c := newCache(t, nil)
	if rep := c.Monitor(); rep.Kind != MonitorEBPF {
		t.Skipf("MonitorAuto chose %v", rep)
	}
	select {
	case <-freed:
	case <-time.After(time.Minute):
		t.Fatal("the load's garbage was not given back a minute after the monitor was adopted")
	}
	if grew := int64(residentGo()) - int64(before); grew > 2<<20 {
		t.Fatalf("the process's resident Go memory grew by %d KiB over the load, want at most 2 MiB", grew>>10)
	}
}

// residentGo is the memory the Go runtime holds from the system and has
// not released.
func residentGo() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}
