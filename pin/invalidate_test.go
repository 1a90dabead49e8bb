package pin

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
)

// cachedRegion registers and deregisters [addr, addr+pages), leaving one
// cached entry, and returns its id.
func cachedRegion(t *testing.T, c *Cache, addr uintptr, pages int) uint64 {
	t.Helper()
	h := register(t, c, sys.Bytes(addr, uintptr(pages)*page), 0)
	deregister(t, c, h)
	return h.entryID()
}

// wantMiss registers [addr, addr+pages) and fails if the entry old serves it.
func wantMiss(t *testing.T, c *Cache, addr uintptr, pages int, old uint64) {
	t.Helper()
	h := register(t, c, sys.Bytes(addr, uintptr(pages)*page), 0)
	if h.entryID() == old {
		t.Errorf("stale hit: entry %d served %#x+%d pages after its memory changed", old, addr, pages)
	}
	deregister(t, c, h)
}

func wantHit(t *testing.T, c *Cache, addr uintptr, pages int, old uint64) {
	t.Helper()
	h := register(t, c, sys.Bytes(addr, uintptr(pages)*page), 0)
	if h.entryID() != old {
		t.Errorf("miss: %#x+%d pages not served by entry %d", addr, pages, old)
	}
	deregister(t, c, h)
}

func wantInvalidations(t *testing.T, c *Cache, n uint64) {
	t.Helper()
	c.sync()
	if got := c.Stats().Invalidations; got != n {
		t.Errorf("invalidations = %d, want %d", got, n)
	}
}

func TestMunmapMiddle(t *testing.T) {
	t.Run("cached", func(t *testing.T) {
		c := newCache(t, foreignMonitor(t))
		addr, _ := mapAnon(t, 8)
		id := cachedRegion(t, c, addr, 8)
		munmap(t, addr+3*page, 2)
		wantInvalidations(t, c, 1)
		// The rest was unpinned (the kernel lock too); the hole was not
		// touched.
		wantLocked(t, c, addr, 3, 0)
		wantLocked(t, c, addr+5*page, 3, 0)
		wantMiss(t, c, addr, 3, id)
		wantMiss(t, c, addr+5*page, 3, id)
		munmap(t, addr, 3)
		munmap(t, addr+5*page, 3)
	})
	t.Run("in-use", func(t *testing.T) {
		c := newCache(t, foreignMonitor(t))
		addr, b := mapAnon(t, 8)
		h := register(t, c, b, 0)
		munmap(t, addr+3*page, 2)
		c.sync()
		if !h.Invalidated() {
			t.Errorf("handle not marked invalidated")
		}
		if st := c.Stats(); st.InUseInvalidations != 1 {
			t.Errorf("in-use invalidations = %d, want 1", st.InUseInvalidations)
		}
		wantLocked(t, c, addr, 3, 1) // still valid for its holder
		h2 := register(t, c, b[:3*page], 0)
		if h2.entryID() == h.entryID() {
			t.Errorf("invalidated entry handed out again")
		}
		wantLocked(t, c, addr, 3, 2)
		deregister(t, c, h)
		wantLocked(t, c, addr, 3, 1)        // the new entry's
		wantLocked(t, c, addr+5*page, 3, 0) // released
		deregister(t, c, h2)
		munmap(t, addr, 3)
		munmap(t, addr+5*page, 3)
	})
}

func TestMapFixed(t *testing.T) {
	c := newCache(t, foreignMonitor(t))
	addr, _ := mapAnon(t, 4)
	id := cachedRegion(t, c, addr, 4)
	if _, err := sys.MmapAnon(addr+page, 2*page, sys.MapFixed); err != nil {
		t.Fatal(err)
	}
	wantInvalidations(t, c, 1)
	wantMiss(t, c, addr, 4, id)
	wantLocked(t, c, addr, 4, 1) // the new registration locked the new pages
	munmap(t, addr, 4)
}

func TestMremap(t *testing.T) {
	cfg := foreignMonitor(t)
	t.Run("shrink", func(t *testing.T) {
		c := newCache(t, cfg)
		addr, _ := mapAnon(t, 8)
		id := cachedRegion(t, c, addr, 8)
		if _, err := sys.Mremap(addr, 8*page, 4*page, 0, 0); err != nil {
			t.Fatal(err)
		}
		wantInvalidations(t, c, 1)
		wantMiss(t, c, addr, 4, id)
		munmap(t, addr, 4)
	})
	t.Run("grow", func(t *testing.T) {
		c := newCache(t, cfg)
		addr, _ := mapAnon(t, 8)
		id := cachedRegion(t, c, addr, 4)
		// Make room after the first 4 pages, then grow them in place: the
		// mapping of the cached pages does not change.
		munmap(t, addr+4*page, 4)
		wantInvalidations(t, c, 0) // not ours
		got, err := sys.Mremap(addr, 4*page, 8*page, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got != addr {
			t.Fatalf("grew in place to %#x, want %#x", got, addr)
		}
		c.sync()
		wantHit(t, c, addr, 4, id)
		wantInvalidations(t, c, 0)
		munmap(t, addr, 8)
	})
	t.Run("move", func(t *testing.T) {
		c := newCache(t, cfg)
		addr, _ := mapAnon(t, 4)
		id := cachedRegion(t, c, addr, 4)
		dst, _ := mapAnon(t, 4)
		got, err := sys.Mremap(addr, 4*page, 4*page, sys.MremapMaymove|sys.MremapFixed, dst)
		if err != nil || got != dst {
			t.Fatalf("mremap to %#x: %#x, %v", dst, got, err)
		}
		wantInvalidations(t, c, 1)
		if _, err := sys.MmapAnon(addr, 4*page, sys.MapFixedNoreplace); err != nil {
			t.Fatal(err)
		}
		wantMiss(t, c, addr, 4, id)
		munmap(t, addr, 4)
		munmap(t, dst, 4)
	})
	t.Run("onto-registered", func(t *testing.T) {
		c := newCache(t, cfg)
		src, _ := mapAnon(t, 4)
		dst, _ := mapAnon(t, 4)
		idSrc := cachedRegion(t, c, src, 4)
		idDst := cachedRegion(t, c, dst, 4)
		got, err := sys.Mremap(src, 4*page, 4*page, sys.MremapMaymove|sys.MremapFixed, dst)
		if err != nil || got != dst {
			t.Fatalf("mremap to %#x: %#x, %v", dst, got, err)
		}
		wantInvalidations(t, c, 2)
		wantMiss(t, c, dst, 4, idDst)
		wantMiss(t, c, dst, 4, idSrc)
		munmap(t, dst, 4)
	})
}

func TestMadvise(t *testing.T) {
	cfg := foreignMonitor(t)
	t.Run("dontneed-locked", func(t *testing.T) {
		c := newCache(t, cfg)
		addr, _ := mapAnon(t, 4)
		id := cachedRegion(t, c, addr, 4)
		if err := sys.Madvise(addr+page, page, sys.MadvDontneed); err == nil {
			t.Logf("MADV_DONTNEED on locked memory succeeded (the kernel refuses it with EINVAL on 6.18)")
		}
		if err := sys.Madvise(addr+page, page, sys.MadvDontneedLocked); err != nil {
			t.Skipf("MADV_DONTNEED_LOCKED (Linux 5.18): %v", err)
		}
		wantInvalidations(t, c, 1)
		// Still mapped: released normally, so unlocked.
		wantLocked(t, c, addr, 4, 0)
		wantMiss(t, c, addr, 4, id)
		munmap(t, addr, 4)
	})
	t.Run("remove", func(t *testing.T) {
		c := newCache(t, cfg)
		fd, err := sys.MemfdCreate("pin-test")
		if err != nil {
			t.Fatal(err)
		}
		defer sys.Close(fd)
		if err := sys.Ftruncate(fd, int64(4*page)); err != nil {
			t.Fatal(err)
		}
		addr, err := sys.MmapFile(fd, 0, 4*page, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer munmap(t, addr, 4)
		id := cachedRegion(t, c, addr, 4)
		if c.Stats().Entries != 1 || c.cachedLen() != 1 {
			t.Fatalf("shmem registration not cached: %+v", c.Stats())
		}
		// The kernel refuses MADV_REMOVE on locked memory: a cached
		// registration protects its pages, and stays valid.
		if err := sys.Madvise(addr, 2*page, sys.MadvRemove); !errors.Is(err, sys.EINVAL) {
			t.Fatalf("MADV_REMOVE on registered shmem: %v, want EINVAL", err)
		}
		wantInvalidations(t, c, 0)
		wantHit(t, c, addr, 4, id)
		// Once the cache lets go of the lock (the callback, say, before the
		// application punches the hole), MADV_REMOVE goes through.
		h := register(t, c, sys.Bytes(addr, 4*page), 0)
		if n := c.Invalidate(addr, 4*page); n != 1 {
			t.Errorf("Invalidate = %d, want 1", n)
		}
		deregister(t, c, h)
		wantLocked(t, c, addr, 4, 0)
		if err := sys.Madvise(addr, 2*page, sys.MadvRemove); err != nil {
			t.Fatalf("MADV_REMOVE after invalidation: %v", err)
		}
		wantMiss(t, c, addr, 4, id)
	})
}

func TestBrkShrink(t *testing.T) {
	c := newCache(t, foreignMonitor(t))
	cur := sys.Brk(0)
	lo := (cur + pageMask) &^ pageMask
	want := lo + 4*page
	if got := sys.Brk(want); got != want {
		t.Skipf("brk cannot grow: %#x, want %#x", got, want)
	}
	id := cachedRegion(t, c, lo, 4)
	// libc's malloc (linked in -race builds) may move the break too; shrink
	// only what is still ours.
	if now := sys.Brk(0); now != want {
		t.Skipf("the break moved under the test: %#x, want %#x", now, want)
	}
	if got := sys.Brk(lo); got != lo {
		t.Fatalf("brk shrink to %#x: %#x", lo, got)
	}
	wantInvalidations(t, c, 1)
	if got := sys.Brk(want); got != want {
		t.Fatalf("brk regrow: %#x", got)
	}
	wantMiss(t, c, lo, 4, id)
	sys.Brk(cur)
}

func TestAllocFree(t *testing.T) {
	for _, kind := range []MonitorKind{MonitorOwned, MonitorAuto} {
		t.Run(kind.String(), func(t *testing.T) {
			c := newCache(t, &Config{Monitor: kind})
			b, err := Alloc(3 * int(page))
			if err != nil {
				t.Fatal(err)
			}
			addr := sys.Addr(b)
			if addr&pageMask != 0 || len(b) != 3*int(page) {
				t.Fatalf("Alloc: %#x+%d", addr, len(b))
			}
			id := cachedRegion(t, c, addr, 3)
			if err := Free(b); err != nil {
				t.Fatal(err)
			}
			if got := c.Stats().Invalidations; got != 1 { // synchronous
				t.Errorf("invalidations right after Free = %d, want 1", got)
			}
			if st := c.Stats(); st.PinnedBytes != 0 || st.Entries != 0 {
				t.Errorf("after Free: %+v", st)
			}
			if err := Free(b); !errors.Is(err, ErrNotOwned) {
				t.Errorf("second Free: %v, want ErrNotOwned", err)
			}
			_ = id
		})
	}
	if _, err := Alloc(0); err == nil {
		t.Errorf("Alloc(0) succeeded")
	}
}

func TestStackRefused(t *testing.T) {
	c := newCache(t, nil)
	_, hi, err := sys.MainStack()
	if err != nil {
		t.Skipf("no [stack] mapping: %v", err)
	}
	b := sys.Bytes(hi-page, 64) // the top of the main thread's stack
	if _, err := c.Register(b, 0); !errors.Is(err, ErrStack) {
		t.Errorf("Register(main stack): %v, want ErrStack", err)
	}
}

// TestBacklog fills the monitor's queue while the cache is locked (the
// handler needs no lock, so munmap completes): ranges that touch merge,
// and past the bound the whole cache is flushed.
func TestBacklog(t *testing.T) {
	cfg := *foreignMonitor(t)
	t.Run("merge", func(t *testing.T) {
		cfg := cfg
		cfg.MaxBacklog = 1
		c := newCache(t, &cfg)
		addr, _ := mapAnon(t, 4)
		cachedRegion(t, c, addr, 4)
		unlock := c.lockForTest()
		for i := range 3 {
			munmap(t, addr+uintptr(i)*page, 1) // adjacent: merged in one slot
		}
		unlock()
		wantInvalidations(t, c, 1)
		if st := c.Stats(); st.EventsLost != 0 || st.FullFlushes != 0 {
			t.Errorf("stats %+v: want no loss", st)
		}
		munmap(t, addr+3*page, 1)
	})
	t.Run("overflow", func(t *testing.T) {
		cfg := cfg
		cfg.MaxBacklog = 2
		c := newCache(t, &cfg)
		var addrs []uintptr
		for range 5 {
			addr, _ := mapAnon(t, 2)
			cachedRegion(t, c, addr, 2)
			addrs = append(addrs, addr)
		}
		keep, kb := mapAnon(t, 1)
		idKeep := cachedRegion(t, c, keep, 1)
		_ = kb
		unlock := c.lockForTest()
		for _, a := range addrs {
			munmap(t, a+page, 1) // never adjacent to each other
		}
		unlock()
		c.sync()
		st := c.Stats()
		if st.EventsLost == 0 || st.FullFlushes == 0 {
			t.Errorf("stats %+v: want lost events and a full flush", st)
		}
		if c.cachedLen() != 0 {
			t.Errorf("%d entries cached after a full flush", c.cachedLen())
		}
		wantMiss(t, c, keep, 1, idKeep)
		for _, a := range addrs {
			munmap(t, a, 1)
		}
		munmap(t, keep, 1)
	})
}

// TestStaleHitRace: munmap, mmap at the same address, register must miss;
// 100,000 times over 4 goroutines (10,000 with -short).
//
// Under userfaultfd each goroutine cycles its buffer inside an address range
// no other goroutine maps into: the kernel frees the range before it queues
// the UNMAP event, so another thread that maps the freed address while the
// unmapping thread still waits for its event can hit the stale entry (a
// window the eBPF monitor closes by probing at syscall entry). What
// userfaultfd guarantees, and this test checks, is that once munmap has
// returned, no lookup made after it returns the stale entry. Owned memory
// (Free invalidates before it unmaps) has no such window, and its
// goroutines share the address space freely.
func TestStaleHitRace(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(testing.TB) *Config
		own  bool
	}{
		{"userfaultfd", foreignMonitor, false},
		{"ebpf", ebpfMonitor, false},
		// Auto starts its monitor in the background: the first iterations
		// run before it is attached, with foreign memory uncached.
		{"auto", func(testing.TB) *Config { return nil }, false},
		{"owned", func(testing.TB) *Config { return &Config{Monitor: MonitorOwned} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(t, tc.cfg(t))
			const goroutines = 4
			total := 100_000
			if testing.Short() {
				total = 10_000
			}
			var stale, reused atomic.Int64
			var wg sync.WaitGroup
			// Map every goroutine's first buffer before any starts: a late
			// mmap(NULL) could otherwise land in another goroutine's hole.
			var firsts [goroutines]uintptr
			if !tc.own {
				// Far below the top of the address space, where mmap(NULL)
				// by the runtime or libc looks first and would take the
				// holes this test makes.
				base := uintptr(0x10_0000_0000)
				for g := range firsts {
					a := base + uintptr(g)<<20
					p, err := sys.MmapAnon(a, uintptr(1+g%2)*page, sys.MapFixedNoreplace)
					if err != nil {
						t.Fatalf("mmap at %#x: %v", a, err)
					}
					firsts[g] = p
				}
			}
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pages := uintptr(1 + g%2)
					n := pages * page
					alloc := func(at uintptr) []byte {
						if tc.own {
							b, err := Alloc(int(n))
							if err != nil {
								t.Error(err)
								return nil
							}
							return b
						}
						flags := 0
						if at != 0 {
							flags = sys.MapFixedNoreplace
						}
						p, err := sys.MmapAnon(at, n, flags)
						if err != nil {
							// Only a mapping made behind our back (by the
							// runtime) can take our own hole.
							maps, _ := os.ReadFile("/proc/self/maps")
							var near []string
							for _, l := range strings.Split(string(maps), "\n") {
								if strings.HasPrefix(l, fmt.Sprintf("%x", at>>20)) {
									near = append(near, l)
								}
							}
							t.Logf("goroutine %d: mmap at %#x: %v\n%s", g, at, err, strings.Join(near, "\n"))
							return nil
						}
						return sys.Bytes(p, n)
					}
					free := func(b []byte) {
						if tc.own {
							Free(b)
						} else if err := sys.MunmapRange(sys.Addr(b), n); err != nil {
							t.Errorf("munmap: %v", err)
						}
					}
					var b []byte
					if tc.own {
						b = alloc(0)
					} else {
						b = sys.Bytes(firsts[g], n)
					}
					for i := 0; i < total/goroutines && b != nil; i++ {
						h, err := c.Register(b, 0)
						if err != nil {
							t.Error(err)
							return
						}
						c.Deregister(h)
						old := sys.Addr(b)
						free(b)
						if b = alloc(old); b == nil {
							return
						}
						if sys.Addr(b) != old {
							continue // owned: another goroutine took it
						}
						reused.Add(1)
						h2, err := c.Register(b, 0)
						if err != nil {
							t.Error(err)
							return
						}
						if h2.entryID() == h.entryID() {
							stale.Add(1)
						}
						c.Deregister(h2)
					}
					if b != nil {
						free(b)
					}
				}()
			}
			wg.Wait()
			if stale.Load() != 0 {
				t.Errorf("%d stale hits in %d reuses of an address", stale.Load(), reused.Load())
			}
			if reused.Load() < int64(total)/4 {
				t.Errorf("only %d of %d iterations got the same address back", reused.Load(), total)
			}
			t.Logf("%d reuses, stats %+v", reused.Load(), c.Stats())
		})
	}
}

// TestStaleHitCrossThread is the race userfaultfd cannot close: one
// goroutine unmaps while another maps the same address as soon as the
// kernel lets it (while the munmap may still be in flight) and registers
// it. The eBPF probe publishes before munmap acts, so the second goroutine
// must miss every time.
func TestStaleHitCrossThread(t *testing.T) {
	t.Run("ebpf", func(t *testing.T) { staleHitCrossThread(t, newCache(t, ebpfMonitor(t))) })
	// From New on, through the background start of the monitor.
	t.Run("auto", func(t *testing.T) { staleHitCrossThread(t, newCache(t, nil)) })
}

func staleHitCrossThread(t *testing.T, c *Cache) {
	total := 100_000
	if testing.Short() {
		total = 10_000
	}
	const pairs = 2
	var stale, reused atomic.Int64
	var wg sync.WaitGroup
	for g := range pairs {
		at := uintptr(0x20_0000_0000) + uintptr(g)<<21
		p, err := sys.MmapAnon(at, page, sys.MapFixedNoreplace)
		if err != nil {
			t.Fatalf("mmap at %#x: %v", at, err)
		}
		toB, toA := make(chan uint64), make(chan struct{})
		wg.Add(2)
		go func() { // A: register, deregister, then unmap once B is racing
			defer wg.Done()
			defer close(toB)
			b := sys.Bytes(p, page)
			for i := 0; i < total/pairs; i++ {
				h, err := c.Register(b, 0)
				if err != nil {
					t.Error(err)
					return
				}
				c.Deregister(h)
				toB <- h.entryID()
				if err := sys.MunmapRange(at, page); err != nil {
					t.Error(err)
					return
				}
				if _, ok := <-toA; !ok {
					return
				}
			}
		}()
		go func() { // B: map the address the moment it is free, register
			defer wg.Done()
			defer close(toA)
			for id := range toB {
				var q uintptr
				for {
					var err error
					if q, err = sys.MmapAnon(at, page, sys.MapFixedNoreplace); err == nil {
						break
					}
				}
				reused.Add(1)
				h, err := c.Register(sys.Bytes(q, page), 0)
				if err != nil {
					t.Error(err)
					return
				}
				if h.entryID() == id {
					stale.Add(1)
				}
				c.Deregister(h)
				toA <- struct{}{}
			}
		}()
	}
	wg.Wait()
	for g := range pairs {
		sys.MunmapRange(uintptr(0x20_0000_0000)+uintptr(g)<<21, page)
	}
	if stale.Load() != 0 {
		t.Errorf("%d stale hits in %d cross-goroutine reuses", stale.Load(), reused.Load())
	}
	t.Logf("%d reuses, stats %+v", reused.Load(), c.Stats())
}
