package sockets

import (
	"bytes"
	"io"
	"testing"
)

// A connection's cached registrations go with it (docs/origins.md): the
// application buffers it pinned for a zero-copy send and a direct read are
// unpinned once it is torn down, and so is the control-pool slab it alone
// used, while the device lives on for other connections.
func TestCloseFlushesRegistrations(t *testing.T) {
	cfg := &Config{ZeroCopy: ZeroCopyAlways}
	keepC, _ := pipe(t, cfg, cfg) // holds the device open
	cache := keepC.(*Conn).dev.nic.Cache()
	if cache == nil {
		t.Skip("no registration cache")
	}
	before := cache.Stats()

	c, s := pipe(t, cfg, cfg)
	src := bytes.Repeat([]byte{0x5a}, 4<<20)
	dst := make([]byte, len(src))
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(s, dst)
		done <- err
	}()
	if _, err := c.Write(src); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
	st := c.(*Conn).Stats()
	if st.BytesZeroCopy == 0 {
		t.Fatalf("no zero-copy transfer: %+v", st)
	}
	during := cache.Stats()
	if during.PinnedBytes < before.PinnedBytes+uint64(len(src)) {
		t.Fatalf("pinned %d bytes during the transfer, %d before: the source is not cached", during.PinnedBytes, before.PinnedBytes)
	}
	c.Close()
	s.Close()
	waitTorn(t, c)
	waitTorn(t, s)
	after := cache.Stats()
	t.Logf("pinned bytes: before %d, with the connection %d, after %d; entries %d, %d, %d",
		before.PinnedBytes, during.PinnedBytes, after.PinnedBytes, before.Entries, during.Entries, after.Entries)
	if after.PinnedBytes != before.PinnedBytes || after.Entries != before.Entries {
		t.Fatalf("after close: %d pinned bytes in %d entries, before the connection %d in %d",
			after.PinnedBytes, after.Entries, before.PinnedBytes, before.Entries)
	}
}
