package nic

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// listening opens two devices and a listener of the first, closed when
// the test ends.
func listening(t *testing.T) (a, b *Device, ln *Listener) {
	t.Helper()
	a, b = openDevice(t, nil), openDevice(t, nil)
	ln, err := a.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return a, b, ln
}

// qpLink dials ln of device a from device b and returns both queue pairs,
// with CQs of their own.
type qpLink struct {
	qa, qb                 *QueuePair
	ascq, arcq, bscq, brcq *CompletionQueue
	abuf, bbuf             []byte // registered receive buffers
	amr, bmr               *MemoryRegion
}

func link(t *testing.T, a, b *Device, ln *Listener) qpLink {
	t.Helper()
	l := qpLink{ascq: a.NewCQ(), arcq: a.NewCQ(), bscq: b.NewCQ(), brcq: b.NewCQ(),
		abuf: make([]byte, 256), bbuf: make([]byte, 256)}
	l.amr = register(t, a, l.abuf, AccessLocalWrite)
	l.bmr = register(t, b, l.bbuf, AccessLocalWrite)
	accepted := make(chan *QueuePair, 1)
	go func() {
		qp, err := ln.Accept(QPOptions{SendCQ: l.ascq, RecvCQ: l.arcq})
		if err != nil {
			t.Error(err)
		}
		accepted <- qp
	}()
	var err error
	if l.qb, err = b.Dial(ln.Addr().String(), QPOptions{SendCQ: l.bscq, RecvCQ: l.brcq}); err != nil {
		t.Fatal(err)
	}
	if l.qa = <-accepted; l.qa == nil {
		t.FailNow()
	}
	return l
}

// exchange sends msg each way and checks that each side receives exactly
// it: a ring that kept a record of an earlier queue pair would deliver
// that first.
func (l qpLink) exchange(t *testing.T, msg string) {
	t.Helper()
	for _, dir := range []struct {
		from, to *QueuePair
		scq, rcq *CompletionQueue
		buf      []byte
		mr       *MemoryRegion
	}{{l.qb, l.qa, l.bscq, l.arcq, l.abuf, l.amr}, {l.qa, l.qb, l.ascq, l.brcq, l.bbuf, l.bmr}} {
		if err := dir.from.PostSend(SendWR{Op: OpSend, Local: []byte(msg)}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, dir.scq); c.Status != StatusSuccess {
			t.Fatalf("send of %q: %+v", msg, c)
		}
		buf := dir.buf
		if err := dir.to.PostRecv(RecvWR{Buf: buf, LKey: dir.mr.LKey}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, dir.rcq); c.Status != StatusSuccess || string(buf[:c.Bytes]) != msg {
			t.Fatalf("received %q (%+v), want %q", buf[:c.Bytes], c, msg)
		}
	}
}

// TestQPSegmentReused: connections between the same two devices, one
// after the other, run on one queue-pair segment — the dialer creates and
// unmaps nothing, the acceptor maps nothing — and each sees only its own
// messages, however many records the rings held before.
func TestQPSegmentReused(t *testing.T) {
	defer func(d time.Duration) { importLinger = d }(importLinger)
	importLinger = time.Hour // nothing expires during the test
	a, b, ln := listening(t)
	qpImports := importedQPSegments()
	first := link(t, a, b, ln)
	seg := first.qb.seg
	// Records of all sizes, wrapping the rings, for the next queue pair
	// to find if they were not reset.
	for i := range 300 {
		first.exchange(t, strings.Repeat(string(rune('a'+i%26)), 1+i%200))
	}
	// And a message each way that nobody receives: still in the rings
	// when the queue pairs close.
	for _, s := range []struct {
		qp  *QueuePair
		scq *CompletionQueue
	}{{first.qb, first.bscq}, {first.qa, first.ascq}} {
		if err := s.qp.PostSend(SendWR{Op: OpSend, Local: []byte("stale")}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, s.scq); c.Status != StatusSuccess {
			t.Fatalf("send: %+v", c)
		}
	}
	first.qa.Close()
	first.qb.Close()
	before := testutil.Snapshot()
	const rounds = 5
	for i := range rounds {
		l := link(t, a, b, ln)
		if l.qb.seg != seg || l.qb.Stats().SegmentsReused != 1 {
			t.Fatalf("round %d: the dialer made a new segment (reused %d)", i, l.qb.Stats().SegmentsReused)
		}
		if got := importedQPSegments() - qpImports; got != 1 {
			t.Fatalf("round %d: the acceptor maps %d queue-pair segments, want the 1 it had", i, got)
		}
		l.exchange(t, fmt.Sprintf("round %d", i))
		l.qa.Close()
		l.qb.Close()
	}
	now := testutil.Snapshot()
	if got := len(now.Mappings) - len(before.Mappings); got != 0 {
		t.Errorf("%d more shared mappings after %d reused queue pairs, want none:\n%s", got, rounds, strings.Join(now.Mappings, "\n"))
	}
	if st := b.Stats(); st.SegmentsReused != rounds {
		t.Errorf("dialer device counted %d reused segments, want %d", st.SegmentsReused, rounds)
	}
}

// TestQPSegmentHeldByAcceptor: a segment whose acceptor has not closed its
// queue pair is not reused — the acceptor could still write into its
// rings — and is once that one closes.
func TestQPSegmentHeldByAcceptor(t *testing.T) {
	defer func(d time.Duration) { importLinger = d }(importLinger)
	importLinger = time.Hour
	a, b, ln := listening(t)
	held := link(t, a, b, ln)
	seg := held.qb.seg
	held.qb.Close() // the acceptor's side stays open
	l := link(t, a, b, ln)
	if l.qb.seg == seg || l.qb.Stats().SegmentsReused != 0 {
		t.Fatal("the dialer reused a segment its acceptor still maps")
	}
	l.exchange(t, "new rings")
	held.qa.Close()
	l.qa.Close()
	l.qb.Close()
	// Now both segments are free: the next two dials reuse them.
	for i := range 2 {
		l := link(t, a, b, ln)
		if l.qb.Stats().SegmentsReused != 1 {
			t.Fatalf("dial %d after both acceptors closed: a new segment", i)
		}
		l.exchange(t, "reused")
		defer l.qa.Close()
		defer l.qb.Close()
	}
}

// TestQPSegmentInUseRefused: a dialer that hands the acceptor a segment
// one of the acceptor's live queue pairs runs on is refused, and the live
// queue pair goes on.
func TestQPSegmentInUseRefused(t *testing.T) {
	a, b, ln := listening(t)
	live := link(t, a, b, ln)
	defer live.qa.Close()
	defer live.qb.Close()
	if live.qb.seg.Fd() < 0 {
		t.Fatal("the dialer did not keep its segment's fd")
	}
	accepted := make(chan error, 1)
	go func() {
		qp, err := ln.Accept(QPOptions{SendCQ: a.NewCQ(), RecvCQ: a.NewCQ()})
		if err == nil {
			qp.Close()
		}
		accepted <- err
	}()
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: ln.Addr().String(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	table, pipe := b.hub.Fds()
	hello := b.hello(b.cfg.RingCapacity, nil).marshal()
	if err := sys.SendFds(conn, hello, live.qb.seg.Fd(), b.regSeg.Fd(), table, pipe); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, cmRecvSize)
	n, fds, err := sys.RecvFds(conn, buf, cmMaxFds)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	sys.CloseAll(fds)
	if _, err := parseReply(buf[:n], len(fds)); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("answer to a hello with a live queue pair's segment: %v, want a reject saying it is in use", err)
	}
	if err := <-accepted; err == nil {
		t.Fatal("accepted a second queue pair on a live segment")
	}
	live.exchange(t, "still here")
}
