package sockets

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// stopAt makes the next call that reaches step s on this process wait
// there, holding its half of Conn.mu, until release is called; reached is
// closed when it got there.
func stopAt(t *testing.T, s step) (reached <-chan struct{}, release func()) {
	t.Helper()
	var once sync.Once
	in, out := make(chan struct{}), make(chan struct{})
	testHook = func(at step) {
		if at == s {
			once.Do(func() {
				close(in)
				<-out
			})
		}
	}
	var rel sync.Once
	release = func() { rel.Do(func() { close(out) }) }
	t.Cleanup(func() {
		release()
		testHook = nil
	})
	return in, release
}

// bound is how long a call may take before the test calls it stuck: a
// call that waits for the other direction's call, stopped at a hook,
// never returns.
const bound = 10 * time.Second

// recv waits for ch within bound.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	return within(t, what, bound, func() T { return <-ch })
}

type ioResult struct {
	n   int
	err error
}

// goRead reads into b in a goroutine of its own and delivers the result.
func goRead(c net.Conn, b []byte) <-chan ioResult {
	ch := make(chan ioResult, 1)
	go func() {
		n, err := c.Read(b)
		ch <- ioResult{n, err}
	}()
	return ch
}

// goWrite is goRead for a Write of p.
func goWrite(c net.Conn, p []byte) <-chan ioResult {
	ch := make(chan ioResult, 1)
	go func() {
		n, err := c.Write(p)
		ch <- ioResult{n, err}
	}()
	return ch
}

// TestReadDoesNotWaitForWrite: a Write stopped in the middle of its data
// messages, holding what it holds of the connection, does not hold up a
// Read in another goroutine of data that is in the ring already. With one
// lock for both directions the Read waited for it.
func TestReadDoesNotWaitForWrite(t *testing.T) {
	client, server := pipe(t, nil, nil)
	a, b := client.(*Conn), server.(*Conn)
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	reached, release := stopAt(t, stepDataSent)
	wrote := goWrite(a, []byte("from a"))
	recv(t, "the Write's data message", reached)
	buf := make([]byte, 16)
	got := goRead(a, buf)
	r := recv(t, "Read during a stopped Write", got)
	if r.err != nil || string(buf[:r.n]) != "x" {
		t.Fatalf("Read = %q, %v; want \"x\"", buf[:r.n], r.err)
	}
	release()
	if w := recv(t, "the released Write", wrote); w.err != nil || w.n != 6 {
		t.Fatalf("Write = %d, %v", w.n, w.err)
	}
	rb := make([]byte, 6)
	if _, err := io.ReadFull(b, rb); err != nil || string(rb) != "from a" {
		t.Fatalf("peer read %q, %v", rb, err)
	}
}

// TestWriteDoesNotWaitForRead is the reverse: a Read stopped in its fast
// path, with the peer's data copied out of the ring and not yet released,
// does not hold up a Write in another goroutine.
func TestWriteDoesNotWaitForRead(t *testing.T) {
	client, server := pipe(t, nil, nil)
	a, b := client.(*Conn), server.(*Conn)
	if _, err := b.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	reached, release := stopAt(t, stepDataTaken)
	buf := make([]byte, 16)
	got := goRead(a, buf)
	recv(t, "the Read's fast path", reached)
	payload := bytes.Repeat([]byte("w"), 20000) // three data messages
	wrote := goWrite(a, payload)
	if w := recv(t, "Write during a stopped Read", wrote); w.err != nil || w.n != len(payload) {
		t.Fatalf("Write = %d, %v", w.n, w.err)
	}
	release()
	if r := recv(t, "the released Read", got); r.err != nil || string(buf[:r.n]) != "y" {
		t.Fatalf("Read = %q, %v; want \"y\"", buf[:r.n], r.err)
	}
	rb := make([]byte, len(payload))
	if _, err := io.ReadFull(b, rb); err != nil || !bytes.Equal(rb, payload) {
		t.Fatalf("peer read %d bytes, %v", len(rb), err)
	}
}

// TestCreditsThroughWaitingRead: a one-way stream larger than many
// windows, from a side whose Read waits all along in another goroutine
// for data that never comes. The reader at the other end only reads, so
// every credit comes back as a credit message, which the waiting Read's
// poll takes (the receive half's fast path) while the Write waits for
// it. The stream must arrive whole, and the Read must still be waiting
// at the end: the credits are not data.
func TestCreditsThroughWaitingRead(t *testing.T) {
	cfg := &Config{Window: 4, BufferSize: 1024}
	client, server := pipe(t, cfg, cfg)
	a := client.(*Conn)
	got := goRead(a, make([]byte, 64))
	// Writes of one data message each (BufferSize 1024): 2,000 of them,
	// far more than a window of 4.
	msg := make([]byte, 2000*500)
	fillStream(msg, 9)
	wrote := make(chan error, 1)
	go func() {
		for rest := msg; len(rest) > 0; {
			n := min(len(rest), 100+len(rest)%800)
			if _, err := a.Write(rest[:n]); err != nil {
				wrote <- err
				return
			}
			rest = rest[n:]
		}
		wrote <- a.CloseWrite()
	}()
	all, err := io.ReadAll(server)
	if werr := recv(t, "the stream's writes", wrote); werr != nil || err != nil {
		t.Fatalf("write: %v; read: %v", werr, err)
	}
	if !bytes.Equal(all, msg) {
		t.Fatalf("read %d bytes of %d, not the bytes written", len(all), len(msg))
	}
	if st := a.Stats(); st.CreditStalls == 0 {
		t.Errorf("the writer never waited for credit (%+v): the test tests nothing", st)
	}
	select {
	case r := <-got:
		t.Fatalf("the waiting Read returned %d, %v before the peer wrote anything", r.n, r.err)
	default:
	}
	server.Close()
	if r := recv(t, "the Read after the peer's close", got); r.n != 0 {
		t.Fatalf("Read = %d, %v", r.n, r.err)
	}
}

// TestQueuedReadDoesNotWaitForWrite: a message larger than the Read's
// buffer waits in the receive queue for the next Reads (a bufio.Reader
// of 4 KiB reading 8 KiB messages), and those Reads do not wait for a
// Write in another goroutine either.
func TestQueuedReadDoesNotWaitForWrite(t *testing.T) {
	client, server := pipe(t, nil, nil)
	a, b := client.(*Conn), server.(*Conn)
	msg := make([]byte, 8000)
	fillStream(msg, 3)
	if _, err := b.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(msg))
	buf := make([]byte, 100)
	n, err := a.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, buf[:n]...)
	reached, release := stopAt(t, stepDataSent)
	wrote := goWrite(a, []byte("from a"))
	recv(t, "the Write's data message", reached)
	for len(got) < len(msg) {
		r := recv(t, "a Read of queued data during a stopped Write", goRead(a, buf))
		if r.err != nil {
			t.Fatal(r.err)
		}
		got = append(got, buf[:r.n]...)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("the message read in pieces differs from the one written")
	}
	release()
	if w := recv(t, "the released Write", wrote); w.err != nil || w.n != 6 {
		t.Fatalf("Write = %d, %v", w.n, w.err)
	}
}
