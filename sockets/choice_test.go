package sockets

import (
	"bytes"
	"net"
	"runtime"
	"testing"
)

// The source choice learns from the application: writes from buffers new
// to the registration cache are copied (pinning them would cost more than
// the copy), a buffer written from twice is registered in place and stays
// cached; the counters say which path each write took, and every byte
// arrives.
func TestSourceChoiceLearnsReuse(t *testing.T) {
	// A zero-copy band (the default has none), and one rendezvous a write
	// (no smaller pieces for a write the reader waits for: WaitedChunk).
	cfg := &Config{ZeroCopyMax: 4 << 20, CopyChunk: 4 << 20, WaitedChunk: -1, MaxCopyInFlight: 8 << 20}
	c, s := pipe(t, cfg, cfg)
	const size = 1 << 20
	var want bytes.Buffer
	got := make(chan []byte, 1)
	go func() {
		// Whole-transfer reads: the choice also follows the peer's read
		// sizes (TestSourceChoiceFollowsReads).
		var all []byte
		buf := make([]byte, size)
		for {
			n, err := s.Read(buf)
			all = append(all, buf[:n]...)
			if err != nil {
				break
			}
		}
		got <- all
	}()
	write := func(b []byte) {
		t.Helper()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		want.Write(b)
	}
	// A new buffer each time, all kept alive: a freed one's address could
	// come back for the next, which then looks like the same buffer.
	var fresh [][]byte
	for i := range 3 {
		fresh = append(fresh, bytes.Repeat([]byte{byte(i + 1)}, size))
		write(fresh[i])
	}
	st := c.(*Conn).Stats()
	if st.CopyNewBuffer != 3 || st.CopyChosen != 3 || st.ZeroChosen != 0 {
		t.Fatalf("three new buffers: %d copied as new, %d copied, %d zero-copy; want 3, 3, 0", st.CopyNewBuffer, st.CopyChosen, st.ZeroChosen)
	}
	reused := bytes.Repeat([]byte{9}, size)
	for range 4 {
		write(reused)
	}
	st = c.(*Conn).Stats()
	// The first write from it is new; from the second on it is reused,
	// then cached.
	if st.CopyNewBuffer != 4 || st.ZeroChosen != 3 {
		t.Fatalf("one buffer written four times: %d copied as new, %d zero-copy; want 4, 3", st.CopyNewBuffer, st.ZeroChosen)
	}
	runtime.KeepAlive(fresh)
	if !c.(*Conn).dev.nic.Cached(reused[c.(*Conn).maxPayload:]) { // all but the rts's inline part
		t.Fatal("the reused buffer is not cached")
	}
	c.(*Conn).CloseWrite()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("received %d bytes, want %d, or they differ", len(b), want.Len())
	}
}

// The source choice follows how the peer reads: a reader that reads in
// pieces smaller than its DirectRead takes a zero-copy source through its
// staging buffer anyway, and says so in its done (flagStaged, version 2);
// the writer then copies, so that its writes return early, and goes back
// to zero copy once the reader takes whole transfers into its own buffer.
func TestSourceChoiceFollowsReads(t *testing.T) {
	cfg := &Config{ZeroCopyMax: 4 << 20, CopyChunk: 4 << 20, WaitedChunk: -1, MaxCopyInFlight: 8 << 20}
	c, s := pipe(t, cfg, cfg)
	const size = 1 << 20
	src := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	exchange := func(readSize int) { t.Helper(); writeAndRead(t, c, s, src, readSize) }
	st := func() Counters { return c.(*Conn).Stats() }
	// Large reads: the reused buffer goes zero-copy from its second write.
	for range 3 {
		exchange(size)
	}
	if a := st(); a.ZeroChosen != 2 || a.CopyPeerStages != 0 {
		t.Fatalf("large reads: %d zero-copy, %d copied for staging peer; want 2, 0", a.ZeroChosen, a.CopyPeerStages)
	}
	// Small reads: the first write learns it, the next ones copy.
	for range 3 {
		exchange(16 << 10)
	}
	if a := st(); a.ZeroChosen != 3 || a.CopyPeerStages != 2 {
		t.Fatalf("small reads: %d zero-copy, %d copied for staging peer; want 3, 2", a.ZeroChosen, a.CopyPeerStages)
	}
	// Large reads again: one copied write learns it, then zero copy.
	for range 3 {
		exchange(size)
	}
	if a := st(); a.ZeroChosen != 5 || a.CopyPeerStages != 3 {
		t.Fatalf("large reads again: %d zero-copy, %d copied for staging peer; want 5, 3", a.ZeroChosen, a.CopyPeerStages)
	}
}

// On a version 1 connection the reader never says staged (a version 1
// peer would take the flag for a violation): small reads, no abort, and
// the writer keeps to the rest of its rules.
func TestStagedFlagNeedsVersion2(t *testing.T) {
	w := &Config{ZeroCopyMax: 4 << 20, CopyChunk: 4 << 20, WaitedChunk: -1, MaxCopyInFlight: 8 << 20, versions: [2]uint16{1, 1}}
	c, s := pipe(t, w, nil)
	if v := c.(*Conn).version; v != 1 {
		t.Fatalf("version %d, want 1", v)
	}
	src := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	for range 3 {
		writeAndRead(t, c, s, src, 16<<10)
	}
	if st := c.(*Conn).Stats(); st.CopyPeerStages != 0 || st.ZeroChosen != 2 {
		t.Fatalf("%d copied for a staging peer, %d zero-copy; want 0 and 2", st.CopyPeerStages, st.ZeroChosen)
	}
}

// writeAndRead writes src on c while it reads it from s in Reads of at
// most readSize bytes, and checks every byte.
func writeAndRead(t *testing.T, c, s net.Conn, src []byte, readSize int) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(src)
		done <- err
	}()
	got := make([]byte, 0, len(src))
	buf := make([]byte, readSize)
	for len(got) < len(src) {
		n, err := s.Read(buf[:min(readSize, len(src)-len(got))])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("data differs")
	}
}

// A copied write that finds none of the connection's copies in flight —
// a request, or the answer to one: its reader waits — goes in pieces of
// WaitedChunk, which the reader copies out while the writer copies the
// next in; with WaitedChunk off it goes in CopyChunk pieces. Every byte
// arrives either way.
func TestWaitedWriteInPieces(t *testing.T) {
	const size = 1 << 20
	src := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	for _, c := range []struct {
		name   string
		cfg    *Config
		pieces uint64 // rendezvous for the write (its first part goes inline)
	}{
		{"default", nil, 4},                  // 256 KiB pieces
		{"off", &Config{WaitedChunk: -1}, 2}, // 960 KiB and the rest
		{"128 KiB", &Config{WaitedChunk: 128 << 10}, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, r := pipe(t, c.cfg, c.cfg)
			writeAndRead(t, w, r, src, size)
			if st := w.(*Conn).Stats(); st.Rendezvous != c.pieces || st.CopyChosen != c.pieces {
				t.Fatalf("a 1 MiB write with nothing in flight: %d rendezvous, %d copied; want %d, %d", st.Rendezvous, st.CopyChosen, c.pieces, c.pieces)
			}
		})
	}
}
