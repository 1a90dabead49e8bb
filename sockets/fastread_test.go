package sockets

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// TestReadFastPath: Reads that find data messages in the ring take them
// themselves (InlineTakes), several into one buffer, and stop, intact, at
// what they cannot take that way: a message larger than the rest of the
// buffer, which the next Read delivers in order.
func TestReadFastPath(t *testing.T) {
	c, s := pipe(t, nil, nil)
	msgs := [][]byte{bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 200), bytes.Repeat([]byte{3}, 3000)}
	for _, m := range msgs {
		if _, err := c.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	before := s.(*Conn).Stats().InlineTakes
	buf := make([]byte, 1000)
	n, err := s.Read(buf)
	if err != nil || n != 300 || !bytes.Equal(buf[:100], msgs[0]) || !bytes.Equal(buf[100:300], msgs[1]) {
		t.Fatalf("first Read: %d bytes, %v; want the first two messages, 300 bytes", n, err)
	}
	if s.(*Conn).Stats().InlineTakes == before {
		t.Error("the Read did not take its messages from the ring itself")
	}
	rest := make([]byte, 3000)
	if _, err := io.ReadFull(s, rest); err != nil || !bytes.Equal(rest, msgs[2]) {
		t.Fatalf("the message left behind: %v", err)
	}
}

// holeyBuffer returns 2000 bytes of memory whose second half is an
// unmapped page: 1000 good bytes, then the hole.
func holeyBuffer(t *testing.T) []byte {
	t.Helper()
	page := sys.PageSize
	region, err := sys.MapAnon(2 * page)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.MunmapRange(sys.Addr(region), uintptr(len(region))) })
	if err := unmapHole(sys.Addr(region)+uintptr(page), page); err != nil {
		t.Fatal(err)
	}
	return region[page-1000 : page+1000]
}

// TestReadFastPathFault: a Read whose buffer faults while the fast path
// copies a message into it fails with EFAULT, and the message is not
// lost: a Read into good memory gets all of it.
func TestReadFastPathFault(t *testing.T) {
	c, s := pipe(t, nil, nil)
	msg := make([]byte, 2000)
	fillStream(msg, 0)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	bad := holeyBuffer(t)
	before := s.(*Conn).Stats().InlineTakes
	s.SetReadDeadline(time.Now().Add(10 * time.Second)) // a lost message fails, not hangs
	_, err := s.Read(bad)
	if ferr := isFault(err, "read"); ferr != nil {
		t.Fatal(ferr)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("after the fault: %v, the message intact: %v", err, bytes.Equal(got, msg))
	}
	// The faulting Read queued the message for the general path, which
	// the good Read took: no fast take counted.
	if got := s.(*Conn).Stats().InlineTakes; got != before {
		t.Errorf("InlineTakes went from %d to %d, want no fast take", before, got)
	}
}

// waitingRead starts a Read of s into b and returns once it waits in the
// completion queue (Stats.Sleeps grew), with a channel for its result.
func waitingRead(t *testing.T, s net.Conn, b []byte) chan readResult {
	t.Helper()
	sc := s.(*Conn)
	sleeps := sc.Stats().Sleeps
	done := make(chan readResult, 1)
	go func() {
		n, err := s.Read(b)
		done <- readResult{n, err}
	}()
	for sc.Stats().Sleeps == sleeps {
		runtime.Gosched()
	}
	return done
}

type readResult struct {
	n   int
	err error
}

// TestReadAfterWaitFastPath: a Read that waited for its message takes it
// straight from the ring once its wait sees it (InlineTakes), not through
// the receive queue, whichever way it waits.
func TestReadAfterWaitFastPath(t *testing.T) {
	for _, mode := range []string{"busy", "block", "adaptive"} {
		t.Run(mode, func(t *testing.T) {
			c, s := pipe(t, benchConfigs[mode], benchConfigs[mode])
			s.SetReadDeadline(time.Now().Add(10 * time.Second)) // a lost message fails, not hangs
			buf := make([]byte, 1000)
			before := s.(*Conn).Stats().InlineTakes
			done := waitingRead(t, s, buf)
			msg := bytes.Repeat([]byte{7}, 300)
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.n != len(msg) || !bytes.Equal(buf[:r.n], msg) {
				t.Fatalf("Read: %d bytes, %v; want the message", r.n, r.err)
			}
			if got := s.(*Conn).Stats().InlineTakes; got == before {
				t.Error("the waiting Read took its message through the receive queue")
			}
		})
	}
}

// TestReadAfterWaitFault: a Read that waited, and whose buffer faults
// while it copies the message its wait found, fails with EFAULT, and the
// message is not lost.
func TestReadAfterWaitFault(t *testing.T) {
	c, s := pipe(t, benchConfigs["busy"], benchConfigs["busy"])
	bad := holeyBuffer(t)
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	done := waitingRead(t, s, bad)
	msg := make([]byte, 2000)
	fillStream(msg, 0)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if ferr := isFault((<-done).err, "read"); ferr != nil {
		t.Fatal(ferr)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("after the fault: %v, the message intact: %v", err, bytes.Equal(got, msg))
	}
}

// TestReadQueuedFault: a Read whose buffer faults while it copies data
// that waits in the receive queue (the rest of a message larger than the
// Read before it) fails with EFAULT, and the data stays queued: a Read
// into good memory gets all of it.
func TestReadQueuedFault(t *testing.T) {
	c, s := pipe(t, nil, nil)
	msg := make([]byte, 3000)
	fillStream(msg, 1)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 100)
	if n, err := s.Read(head); err != nil || n != len(head) {
		t.Fatalf("first Read: %d, %v", n, err)
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Second)) // a lost message fails, not hangs
	_, err := s.Read(holeyBuffer(t))
	if ferr := isFault(err, "read"); ferr != nil {
		t.Fatal(ferr)
	}
	rest := make([]byte, len(msg)-len(head))
	if _, err := io.ReadFull(s, rest); err != nil || !bytes.Equal(rest, msg[len(head):]) {
		t.Fatalf("after the fault: %v, the rest intact: %v", err, bytes.Equal(rest, msg[len(head):]))
	}
}
