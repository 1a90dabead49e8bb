package sockets

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/nic"
)

// TestCloseQuick: a Close whose bytes, fin included, all lie in the peer's
// ring hangs up at once, without a linger; the peer reads them all, then
// io.EOF, and closes at once too (the queue pair is gone).
func TestCloseQuick(t *testing.T) {
	client, server := pipe(t, nil, nil)
	msg := writeThenClose(t, client, 3*1000)
	c := client.(*Conn)
	if n := c.Stats().QuickCloses; n != 1 {
		t.Fatalf("QuickCloses %d after a Close with everything in the ring, want 1", n)
	}
	waitTorn(t, client)
	got, err := readToEOF(server)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("peer of a quick Close read %d of %d bytes, %v; want all, then EOF", len(got), len(msg), err)
	}
	server.Close()
	waitTorn(t, server)
}

// TestWriteAfterPeerClosedKeepsData: the peer writes and closes at once
// (a quick Close: it hangs up); our next Write fails on the queue pair in
// error, and must not take down what the peer sent: a Read still gets all
// of it, then io.EOF. A reset at the failed Write lost both.
func TestWriteAfterPeerClosedKeepsData(t *testing.T) {
	client, server := pipe(t, nil, nil)
	msg := writeThenClose(t, client, 3*1000)
	waitTorn(t, client)
	sc := server.(*Conn)
	// The hang-up reaches the server's queue pair (no Read polls here).
	end := time.Now().Add(10 * time.Second)
	for sc.qp.State() != nic.QPError {
		if time.Now().After(end) {
			t.Fatal("the server's queue pair never saw the client hang up")
		}
		runtime.Gosched()
	}
	if _, err := server.Write([]byte("late")); err == nil {
		t.Fatal("Write to a peer that hung up succeeded")
	}
	got, err := readToEOF(server)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("after a failed Write, read %d of the %d bytes the peer sent, %v; want all, then EOF", len(got), len(msg), err)
	}
	if n := sc.Stats().Resets; n != 0 {
		t.Fatalf("%d resets counted for a peer that closed cleanly, want 0", n)
	}
	server.Close()
	waitTorn(t, server)
}

// writeThenClose writes n random bytes on c and closes it; it returns
// the bytes.
func writeThenClose(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	msg := randBytes(n)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	return msg
}

// TestCloseLingersForRendezvous: a Close while a rendezvous source is still
// the peer's to read lingers until it is read; the peer gets every byte.
func TestCloseLingersForRendezvous(t *testing.T) {
	client, server := pipe(t, nil, nil)
	msg := writeThenClose(t, client, 1<<20) // past EagerThreshold: a rendezvous
	if n := client.(*Conn).Stats().QuickCloses; n != 0 {
		t.Fatalf("QuickCloses %d with a rendezvous unread, want 0: the Close must linger", n)
	}
	got, err := readToEOF(server)
	if err != nil || sha256.Sum256(got) != sha256.Sum256(msg) {
		t.Fatalf("peer read %d of %d bytes, %v; want all, then EOF", len(got), len(msg), err)
	}
}

// TestCloseEarlyBeforeTaken: an early dial (its listener answered before)
// that writes and closes before the listener has taken it must linger:
// hung up then, its listener would fail the handshake's reply and what it
// wrote would be lost.
func TestCloseEarlyBeforeTaken(t *testing.T) {
	ln, err := Listen("sandirect", testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accept := func() (net.Conn, error) { return acceptAsync(ln)() }
	// A first connection makes the listener known: the next dial is early.
	first, err := Dial("sandirect", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := accept()
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	s.Close()
	waitTorn(t, first)
	waitTorn(t, s)

	release := make(chan struct{})
	hold := func() { <-release }
	testHookHandshake.Store(&hold)
	defer testHookHandshake.Store(nil)
	c, err := Dial("sandirect", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if !c.(*Conn).qp.Early() {
		t.Fatal("the second dial is not early: the test tests nothing")
	}
	msg := []byte("written before the listener took the connection")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := c.(*Conn).Stats().QuickCloses; n != 0 {
		t.Errorf("QuickCloses %d on an early dial not yet taken, want 0", n)
	}
	testHookHandshake.Store(nil)
	close(release)
	s, err = accept()
	if err != nil {
		t.Fatalf("the early connection closed before its handshake was never accepted: %v", err)
	}
	defer s.Close()
	got, err := readToEOF(s)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read %q, %v; want %q, then EOF", got, err, msg)
	}
	waitTorn(t, c)
}

// The quick-close child: dials args[0], writes args[1] bytes of randBytes
// twice (the second dial is early, its listener known), closes and exits
// at once — no Flush, no wait for its teardown. A Close that lingered
// would fail it.
func init() {
	testutil.RegisterChild("close-and-exit", func(args []string) error {
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		for i := range 2 {
			c, err := Dial("sandirect", args[0])
			if err != nil {
				return err
			}
			sc := c.(*Conn)
			// An early dial closes quickly once its listener has taken
			// it: the listener's byte in the ring says so.
			if _, err := c.Write(randBytes(n)); err != nil {
				return err
			}
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil {
				return fmt.Errorf("dial %d: the listener's byte: %w", i, err)
			}
			if err := c.Close(); err != nil {
				return err
			}
			if q := sc.Stats().QuickCloses; q != 1 {
				return fmt.Errorf("dial %d: QuickCloses %d, want 1", i, q)
			}
		}
		return nil // exits: what the second connection wrote lives in the rings alone
	})
}

// TestCloseQuickThenExit: a process that closes quickly and exits at once
// leaves what it wrote in the rings, which the listener reads to the
// end: every byte, then io.EOF, not a reset.
func TestCloseQuickThenExit(t *testing.T) {
	ln, err := Listen("sandirect", testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const n = 20000 // three data messages
	child := testutil.StartChild(t, "close-and-exit", nil, ln.Addr().String(), strconv.Itoa(n))
	for i := range 2 {
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			// Read only once the child is gone.
			if err := child.Wait(20 * time.Second); err != nil {
				t.Fatalf("child: %v; output:\n%s", err, child.Output())
			}
		}
		got, err := readToEOF(s)
		if err != nil || !bytes.Equal(got, randBytes(n)) {
			t.Fatalf("connection %d: read %d of %d bytes, %v; want all, then EOF", i, len(got), n, err)
		}
		s.Close()
	}
}
