package pin

import (
	"os"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/internal/sys"
)

// granule is the eBPF monitor's watch granule.
const granule = 1 << bpfmon.GranuleShift

// granuleMapped maps two granules of anonymous memory, unmapped at the
// test's end, and returns the start of the whole granule inside them.
func granuleMapped(t *testing.T) uintptr {
	t.Helper()
	p, err := sys.MmapAnon(0, 2*granule, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.MunmapRange(p, 2*granule) })
	return (p + granule - 1) &^ (granule - 1)
}

// TestEBPFOverflowFlushes fills the probes' ring faster than it is drained:
// the lost events make the cache drop everything (it cannot know which
// ranges changed), so a registration that was cached misses afterwards.
func TestEBPFOverflowFlushes(t *testing.T) {
	ebpfRingSize = os.Getpagesize()
	defer func() { ebpfRingSize = 0 }()
	c := newCache(t, ebpfMonitor(t))
	base := granuleMapped(t)
	buf := sys.Bytes(base, page)
	other := base + 16*page // same granule, not overlapping buf
	h, err := c.Register(buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Deregister(h)
	// Each madvise is an event (watched granule); thousands back to back
	// outrun the drain goroutine's wake-up.
	for i := 0; i < 20000; i++ {
		if err := sys.Madvise(other, page, sys.MadvDontneed); err != nil {
			t.Fatal(err)
		}
	}
	h2, err := c.Register(buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Deregister(h2)
	st := c.Stats()
	t.Logf("stats %+v", st)
	if st.EventsLost == 0 || st.FullFlushes == 0 {
		t.Fatalf("no overflow seen: %+v", st)
	}
	if h2.entryID() == h.entryID() {
		t.Fatal("the cached entry survived a full flush")
	}
}

// TestEBPFScavenger: the Go runtime returns free heap memory with madvise
// (FreeOSMemory forces it). That must not invalidate a registration of a
// heap buffer in use.
func TestEBPFScavenger(t *testing.T) {
	c := newCache(t, ebpfMonitor(t))
	keep := make([]byte, 1<<20)
	for i := range keep {
		keep[i] = byte(i)
	}
	h, err := c.Register(keep, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Deregister(h)
	for range 5 {
		garbage := make([][]byte, 64)
		for i := range garbage {
			garbage[i] = make([]byte, 256<<10)
		}
		runtime.KeepAlive(garbage)
		garbage = nil
		debug.FreeOSMemory() // GC, then madvise of the freed spans
	}
	h2, err := c.Register(keep, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Deregister(h2)
	if h2.entryID() != h.entryID() {
		t.Fatalf("heap registration invalidated by the scavenger: stats %+v", c.Stats())
	}
	t.Logf("stats %+v", c.Stats())
}

// TestEBPFDrainUnwatches: an munmap in the middle of the last cached entry
// on a granule releases the rest of it, and that clears the granule's
// watch from inside the drain — which holds the Monitor's locks while it
// applies events: the unwatch waits until the drain is done (taken inside
// it, the Monitor's lifetime lock was read-locked twice, which the
// lock-rank checker reports and a Close waiting in between deadlocks).
// The granule is watched again when an entry needs it.
func TestEBPFDrainUnwatches(t *testing.T) {
	c := newCache(t, ebpfMonitor(t))
	base := granuleMapped(t)
	e := c.mon.(*ebpfMon)
	state := func() (watched bool, deferred int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, watched = e.set[uint64(base)/granule]
		return watched, len(e.deferred)
	}
	id := cachedRegion(t, c, base, 8)
	if w, _ := state(); !w {
		t.Fatal("the granule of a cached entry is not watched")
	}
	munmap(t, base+3*page, 2)
	wantInvalidations(t, c, 1)
	if w, d := state(); w || d != 0 {
		t.Errorf("after the drain: granule watched %v, %d unwatches deferred; want neither", w, d)
	}
	if _, err := sys.MmapAnon(base+3*page, 2*page, sys.MapFixedNoreplace); err != nil {
		t.Fatal(err)
	}
	wantMiss(t, c, base, 8, id)
	id = cachedRegion(t, c, base, 8)
	if w, _ := state(); !w {
		t.Error("the granule is not watched again for a new entry")
	}
	munmap(t, base+3*page, 2) // the new entry is invalidated too: its watch works
	wantInvalidations(t, c, 2)
	wantMiss(t, c, base, 3, id)

	// All of an entry's memory unmapped: its pages are dropped, not
	// unpinned, and the granule is cleared all the same.
	if _, err := sys.MmapAnon(base+3*page, 2*page, sys.MapFixedNoreplace); err != nil {
		t.Fatal(err)
	}
	id = cachedRegion(t, c, base, 8)
	munmap(t, base, 8)
	wantInvalidations(t, c, 3)
	if w, d := state(); w || d != 0 {
		t.Errorf("after the whole entry's munmap: granule watched %v, %d unwatches deferred; want neither", w, d)
	}
	if _, err := sys.MmapAnon(base, 8*page, sys.MapFixedNoreplace); err != nil {
		t.Fatal(err)
	}
	wantMiss(t, c, base, 8, id)
}
