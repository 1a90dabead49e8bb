package pin

import "testing"

// Cached answers what a Register would find, and changes nothing.
func TestCached(t *testing.T) {
	c := newCache(t, foreignMonitor(t))
	addr, b := mapAnon(t, 4)
	defer munmap(t, addr, 4)
	if c.Cached(b, 0) {
		t.Fatal("cached before any registration")
	}
	if st := c.Stats(); st.Gets != 0 || st.PinnedBytes != 0 {
		t.Fatalf("Cached registered something: %+v", st)
	}
	h := register(t, c, b[:2*page], AccessLocalWrite)
	if err := c.Deregister(h); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		buf    []byte
		access Access
		want   bool
	}{
		{"same", b[:2*page], 0, true},
		{"inside", b[10 : page+10], AccessLocalWrite, true},
		{"more access", b[:page], AccessRemoteRead, false},
		{"beyond", b[:3*page], 0, false},
		{"empty", b[:0], 0, false},
	} {
		if got := c.Cached(tc.buf, tc.access); got != tc.want {
			t.Errorf("%s: Cached = %v, want %v", tc.name, got, tc.want)
		}
	}
	c.Invalidate(addr, 2*uintptr(page))
	if c.Cached(b[:page], 0) {
		t.Fatal("cached after its memory was invalidated")
	}
}
