package sockets

import (
	"bytes"
	"io"
	"testing"
)

// The source choice learns from the application: writes from buffers new
// to the registration cache are copied (pinning them would cost more than
// the copy), a buffer written from twice is registered in place and stays
// cached; the counters say which path each write took, and every byte
// arrives.
func TestSourceChoiceLearnsReuse(t *testing.T) {
	// A zero-copy band (the default has none), and one rendezvous a write.
	cfg := &Config{ZeroCopyMax: 4 << 20, CopyChunk: 4 << 20, MaxCopyInFlight: 8 << 20}
	c, s := pipe(t, cfg, cfg)
	const size = 1 << 20
	var want bytes.Buffer
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(s)
		got <- b
	}()
	write := func(b []byte) {
		t.Helper()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		want.Write(b)
	}
	for i := range 3 {
		write(bytes.Repeat([]byte{byte(i + 1)}, size)) // a new buffer each time
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
	if !c.(*Conn).dev.nic.Cached(reused) {
		t.Fatal("the reused buffer is not cached")
	}
	c.(*Conn).CloseWrite()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("received %d bytes, want %d, or they differ", len(b), want.Len())
	}
}
