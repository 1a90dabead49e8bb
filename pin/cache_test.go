package pin

import (
	"errors"
	"syscall"
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
)

func TestHitMiss(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    func(testing.TB) *Config
		alloc  bool // memory from Alloc instead of mmap
		cached bool
	}{
		{"userfaultfd", foreignMonitor, false, true},
		{"owned/alloc", func(testing.TB) *Config { return &Config{Monitor: MonitorOwned} }, true, true},
		{"owned/foreign", func(testing.TB) *Config { return &Config{Monitor: MonitorOwned} }, false, false},
		{"none/alloc", func(testing.TB) *Config { return &Config{Monitor: MonitorNone} }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(t, tc.cfg(t))
			var b []byte
			var addr uintptr
			if tc.alloc {
				var err error
				if b, err = Alloc(4 * int(page)); err != nil {
					t.Fatal(err)
				}
				defer Free(b)
				addr = sys.Addr(b)
			} else {
				addr, b = mapAnon(t, 4)
				defer munmap(t, addr, 4)
			}
			h1 := register(t, c, b, AccessLocalWrite)
			wantLocked(t, c, addr, 4, 1)
			h2 := register(t, c, b[10:page+10], 0) // in use: a hit, or a second pin
			if tc.cached && h2.entryID() != h1.entryID() {
				t.Errorf("second register while in use: entry %d, want %d", h2.entryID(), h1.entryID())
			}
			deregister(t, c, h2)
			deregister(t, c, h1)
			if tc.cached {
				wantLocked(t, c, addr, 4, 1)
			} else {
				wantLocked(t, c, addr, 4, 0)
			}
			h3 := register(t, c, b[page:], 0)
			if hit := h3.entryID() == h1.entryID(); hit != tc.cached {
				t.Errorf("register after deregister: hit %v, want %v", hit, tc.cached)
			}
			if h3.Addr() != addr+page || h3.Len() != len(b)-int(page) {
				t.Errorf("handle %#x+%d, want %#x+%d", h3.Addr(), h3.Len(), addr+page, len(b)-int(page))
			}
			deregister(t, c, h3)
			if err := c.Deregister(h3); !errors.Is(err, ErrNotRegistered) && !tc.cached {
				// an uncached entry is gone; a cached one has refs 0
				t.Errorf("second Deregister: %v, want ErrNotRegistered", err)
			}
			st := c.Stats()
			wantHits := uint64(0)
			if tc.cached {
				wantHits = 2
			}
			if st.Hits != wantHits || st.Gets != 3 || st.Misses != 3-wantHits {
				t.Errorf("stats %+v: want %d hits of 3 gets", st, wantHits)
			}
		})
	}
}

func TestDeregisterTwice(t *testing.T) {
	c := newCache(t, &Config{Monitor: MonitorOwned})
	b, err := Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	defer Free(b)
	h := register(t, c, b, 0)
	deregister(t, c, h)
	if err := c.Deregister(h); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("second Deregister: %v, want ErrNotRegistered", err)
	}
	if err := c.Deregister(Handle{}); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("Deregister(zero): %v, want ErrNotRegistered", err)
	}
	if _, err := c.Register(nil, 0); !errors.Is(err, ErrEmpty) {
		t.Errorf("Register(nil): %v, want ErrEmpty", err)
	}
}

// TestLayouts covers sub-page, page-straddling and overlapping
// registrations: which entry serves each, and that pin counts and the
// kernel's locks stay right when entries merge and release.
func TestLayouts(t *testing.T) {
	c := newCache(t, foreignMonitor(t))
	t.Run("sub-page", func(t *testing.T) {
		addr, b := mapAnon(t, 2)
		defer munmap(t, addr, 2)
		h1 := register(t, c, b[100:200], 0)
		h2 := register(t, c, b[300:400], 0) // same page: a hit
		if h1.entryID() != h2.entryID() {
			t.Errorf("second sub-page registration made a new entry")
		}
		if r := h1.Region(); r.Addr != addr || r.Len != page {
			t.Errorf("region %#x+%d, want %#x+%d", r.Addr, r.Len, addr, page)
		}
		wantLocked(t, c, addr, 1, 1)
		wantLocked(t, c, addr+page, 1, 0)
		deregister(t, c, h1)
		deregister(t, c, h2)
	})
	t.Run("straddling", func(t *testing.T) {
		addr, b := mapAnon(t, 3)
		defer munmap(t, addr, 3)
		h := register(t, c, b[page-8:page+8], 0)
		if r := h.Region(); r.Addr != addr || r.Len != 2*page {
			t.Errorf("region %#x+%d, want %#x+%d", r.Addr, r.Len, addr, 2*page)
		}
		wantLocked(t, c, addr, 2, 1)
		wantLocked(t, c, addr+2*page, 1, 0)
		deregister(t, c, h)
	})
	t.Run("overlap/unused", func(t *testing.T) {
		addr, b := mapAnon(t, 6)
		defer munmap(t, addr, 6)
		h1 := register(t, c, b[:3*page], 0)
		deregister(t, c, h1)
		h2 := register(t, c, b[2*page:5*page], 0) // overlaps: merged
		if r := h2.Region(); r.Addr != addr || r.Len != 5*page {
			t.Errorf("merged region %#x+%d, want %#x+%d", r.Addr, r.Len, addr, 5*page)
		}
		wantLocked(t, c, addr, 5, 1) // the old entry released, pages never unlocked
		wantLocked(t, c, addr+5*page, 1, 0)
		deregister(t, c, h2)
		h3 := register(t, c, b[page:4*page], 0)
		if h3.entryID() != h2.entryID() {
			t.Errorf("register inside the merged region missed")
		}
		deregister(t, c, h3)
	})
	t.Run("overlap/in-use", func(t *testing.T) {
		addr, b := mapAnon(t, 6)
		defer munmap(t, addr, 6)
		h1 := register(t, c, b[:3*page], 0)
		h2 := register(t, c, b[2*page:5*page], 0)
		// The new entry covers the union; the old one, in use, keeps its own
		// pins until released.
		wantLocked(t, c, addr, 3, 2)
		wantLocked(t, c, addr+3*page, 2, 1)
		deregister(t, c, h1) // releases the old entry: only its own count
		wantLocked(t, c, addr, 5, 1)
		h3 := register(t, c, b[:page], 0)
		if h3.entryID() != h2.entryID() {
			t.Errorf("old entry handed out again after its merge")
		}
		deregister(t, c, h3)
		deregister(t, c, h2)
	})
	t.Run("wider-access", func(t *testing.T) {
		addr, b := mapAnon(t, 1)
		defer munmap(t, addr, 1)
		h1 := register(t, c, b, 0)
		deregister(t, c, h1)
		h2 := register(t, c, b, AccessLocalWrite) // more access: a new registration
		if h2.entryID() == h1.entryID() {
			t.Errorf("read-only entry served a write registration")
		}
		deregister(t, c, h2)
		h3 := register(t, c, b, 0) // less access: a hit
		if h3.entryID() != h2.entryID() {
			t.Errorf("write entry did not serve a read registration")
		}
		deregister(t, c, h3)
	})
}

// TestNoNesting: two registrations of the same page that are not cached
// share the kernel's single lock; releasing one keeps the page locked.
func TestNoNesting(t *testing.T) {
	c := newCache(t, &Config{Monitor: MonitorNone})
	addr, b := mapAnon(t, 1)
	defer munmap(t, addr, 1)
	h1 := register(t, c, b[:10], 0)
	h2 := register(t, c, b[20:30], 0)
	wantLocked(t, c, addr, 1, 2)
	deregister(t, c, h1)
	wantLocked(t, c, addr, 1, 1)
	deregister(t, c, h2)
	wantLocked(t, c, addr, 1, 0)
}

func TestLimits(t *testing.T) {
	t.Run("count", func(t *testing.T) {
		c := newCache(t, &Config{Monitor: MonitorOwned, MaxEntries: 2})
		bufs := allocN(t, 3, 1)
		h0 := register(t, c, bufs[0], 0)
		h1 := register(t, c, bufs[1], 0)
		if _, err := c.Register(bufs[2], 0); !errors.Is(err, syscall.ENOBUFS) {
			t.Fatalf("third register with two in use: %v, want ENOBUFS", err)
		}
		deregister(t, c, h0)
		h2 := register(t, c, bufs[2], 0) // evicts bufs[0]
		if st := c.Stats(); st.Evictions != 1 || st.Entries != 2 {
			t.Errorf("stats %+v: want 1 eviction, 2 entries", st)
		}
		wantLocked(t, c, sys.Addr(bufs[0]), 1, 0)
		deregister(t, c, h1)
		deregister(t, c, h2)
	})
	t.Run("bytes", func(t *testing.T) {
		c := newCache(t, &Config{Monitor: MonitorOwned, MaxPinnedBytes: int64(4 * page)})
		bufs := allocN(t, 2, 3)
		h0 := register(t, c, bufs[0], 0)
		if _, err := c.Register(bufs[1][:2*page], 0); !errors.Is(err, syscall.ENOBUFS) {
			t.Fatalf("register past the byte limit: %v, want ENOBUFS", err)
		}
		if st := c.Stats(); st.PinnedBytes != uint64(3*page) {
			t.Errorf("pinned %d bytes after a failed register, want %d", st.PinnedBytes, 3*page)
		}
		deregister(t, c, h0)
		h1 := register(t, c, bufs[1][:2*page], 0) // evicts bufs[0]
		if st := c.Stats(); st.Evictions != 1 || st.PinnedBytes != uint64(2*page) {
			t.Errorf("stats %+v: want 1 eviction, %d bytes", st, 2*page)
		}
		deregister(t, c, h1)
	})
	t.Run("in-use", func(t *testing.T) {
		c := newCache(t, &Config{Monitor: MonitorOwned, MaxEntries: 1})
		bufs := allocN(t, 2, 1)
		h0 := register(t, c, bufs[0], 0)
		if _, err := c.Register(bufs[1], 0); !errors.Is(err, syscall.ENOBUFS) {
			t.Fatalf("register with the only entry in use: %v, want ENOBUFS", err)
		}
		wantLocked(t, c, sys.Addr(bufs[0]), 1, 1) // in use: never evicted
		if h0.Invalidated() {
			t.Errorf("in-use entry invalidated by a failed register")
		}
		deregister(t, c, h0)
	})
}

func allocN(tb testing.TB, n, pages int) [][]byte {
	tb.Helper()
	var bufs [][]byte
	for range n {
		b, err := Alloc(pages * int(page))
		if err != nil {
			tb.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	tb.Cleanup(func() {
		for _, b := range bufs {
			Free(b)
		}
	})
	return bufs
}

func TestFlush(t *testing.T) {
	c := newCache(t, &Config{Monitor: MonitorOwned})
	bufs := allocN(t, 3, 1)
	const conn1, conn2 Owner = 1, 2
	h0, err := c.RegisterFor(conn1, bufs[0], AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	deregister(t, c, h0)
	h1, err := c.RegisterFor(conn1, bufs[1], 0)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := c.RegisterFor(conn2, bufs[2], 0)
	if err != nil {
		t.Fatal(err)
	}
	deregister(t, c, h2)
	if n := c.Flush(conn1); n != 2 {
		t.Errorf("Flush(conn1) = %d, want 2", n)
	}
	wantLocked(t, c, sys.Addr(bufs[0]), 1, 0) // unused: released now
	wantLocked(t, c, sys.Addr(bufs[1]), 1, 1) // in use: until Deregister
	wantLocked(t, c, sys.Addr(bufs[2]), 1, 1) // conn2's: still cached
	deregister(t, c, h1)
	wantLocked(t, c, sys.Addr(bufs[1]), 1, 0)
	h3 := register(t, c, bufs[1], 0)
	if h3.entryID() == h1.entryID() {
		t.Errorf("flushed entry handed out again")
	}
	deregister(t, c, h3)
	h4 := register(t, c, bufs[2], 0)
	if h4.entryID() != h2.entryID() {
		t.Errorf("other owner's entry flushed")
	}
	deregister(t, c, h4)

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, b := range bufs {
		wantLocked(t, c, sys.Addr(b), 1, 0)
	}
	if _, err := c.Register(bufs[0], 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v, want ErrClosed", err)
	}
	if st := c.Stats(); st.Entries != 0 || st.PinnedBytes != 0 || st.FullFlushes != 1 {
		t.Errorf("stats after Close %+v", st)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"default", DefaultConfig(), true},
		{"negative entries", Config{MaxEntries: -1}, false},
		{"sub-page budget", Config{MaxPinnedBytes: 1}, false},
		{"huge backlog", Config{MaxBacklog: 1 << 21}, false},
		{"bad monitor", Config{Monitor: 42}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != tc.ok {
				t.Errorf("Validate = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not match ErrInvalidConfig", err)
			}
		})
	}
	if d := DefaultConfig(); d.MaxEntries <= 0 || d.MaxPinnedBytes < int64(page) || d.MaxBacklog <= 0 {
		t.Errorf("DefaultConfig %+v", d)
	}
}

// TestInvalidateIdle: a range with a registration in use is left alone
// (its holder keeps remote access); once the last holder deregisters, the
// range's entries are invalidated and unpinned in one step.
func TestInvalidateIdle(t *testing.T) {
	c := newCache(t, &Config{Monitor: MonitorOwned})
	bufs := allocN(t, 2, 2)
	h0 := register(t, c, bufs[0], AccessRemoteRead)
	h1 := register(t, c, bufs[1], 0)
	deregister(t, c, h1) // cached, unused
	a, b := sys.Addr(bufs[0]), sys.Addr(bufs[1])
	lo, hi := min(a, b), max(a, b)+2*page // both buffers
	if c.InvalidateIdle(lo, hi-lo) {
		t.Fatal("InvalidateIdle succeeded over a registration in use")
	}
	if !c.Cached(bufs[1], 0) || !c.Cached(bufs[0], AccessRemoteRead) {
		t.Fatal("a refused InvalidateIdle dropped entries")
	}
	deregister(t, c, h0)
	if !c.InvalidateIdle(lo, hi-lo) {
		t.Fatal("InvalidateIdle refused a range with nothing in use")
	}
	if c.Cached(bufs[0], 0) || c.Cached(bufs[1], 0) {
		t.Fatal("entries still cached after InvalidateIdle")
	}
	wantLocked(t, c, sys.Addr(bufs[0]), 2, 0)
	wantLocked(t, c, sys.Addr(bufs[1]), 2, 0)
}
