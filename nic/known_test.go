package nic

import (
	"bytes"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// earlyListener accepts on a listener of a fresh device with answer as
// its Answer, and hands each accepted queue pair (or error) to the
// returned channel.
func earlyListener(t *testing.T, answer func([]byte) ([]byte, error)) (*Listener, *Device, chan acceptResult) {
	t.Helper()
	return gatedListener(t, answer, nil)
}

// gatedListener is earlyListener whose handshakes each wait for a value
// on gate first, if gate is not nil: the test says when the listener
// answers.
func gatedListener(t *testing.T, answer func([]byte) ([]byte, error), gate <-chan struct{}) (*Listener, *Device, chan acceptResult) {
	t.Helper()
	d := openDevice(t, nil)
	ln, err := d.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan acceptResult, 16)
	go func() {
		for {
			p, err := ln.AcceptPending()
			if err != nil {
				return
			}
			if gate != nil {
				<-gate
			}
			qp, err := p.Handshake(QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), Answer: answer})
			ch <- acceptResult{qp, err}
		}
	}()
	return ln, d, ch
}

type acceptResult struct {
	qp  *QueuePair
	err error
}

// TestEarlyDial: a second dial with the same hello to the same listener
// returns before the reply and sends at once; the reply, when it comes,
// is checked, and the queue pair carries on, RDMA included.
func TestEarlyDial(t *testing.T) {
	ln, ld, accepted := earlyListener(t, func(b []byte) ([]byte, error) { return append([]byte("re: "), b...), nil })
	target := alloc(t, ld, 4096)
	copy(target, "device memory of the listener")
	tmr := register(t, ld, target, AccessRemoteRead)
	d := openDevice(t, nil)
	opts := func() QPOptions {
		return QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), PrivateData: []byte("hello"), Early: true}
	}
	for i := range 3 {
		qp, err := d.Dial(ln.Addr().String(), opts())
		if err != nil {
			t.Fatal(err)
		}
		if qp.Early() != (i > 0) {
			t.Fatalf("dial %d: early %v", i, qp.Early())
		}
		if got := string(qp.PeerPrivateData()); got != "re: hello" {
			t.Fatalf("dial %d: private data %q", i, got)
		}
		// Sent before the listener's handshake may have run.
		if err := qp.PostSend(SendWR{ID: 1, Op: OpSend, Local: []byte("early bytes")}); err != nil {
			t.Fatal(err)
		}
		r := <-accepted
		if r.err != nil {
			t.Fatal(r.err)
		}
		buf := make([]byte, 64)
		rmr := register(t, ld, buf, AccessLocalWrite)
		r.qp.PostRecv(RecvWR{ID: 2, Buf: buf, LKey: rmr.LKey})
		if c := wait(t, r.qp.recvCQ); c.Status != StatusSuccess || string(buf[:c.Bytes]) != "early bytes" {
			t.Fatalf("dial %d: the listener received %+v %q", i, c, buf[:c.Bytes])
		}
		if c := wait(t, qp.sendCQ); c.Status != StatusSuccess {
			t.Fatalf("dial %d: send %+v", i, c)
		}
		// RDMA Read of the listener's device memory, on the table the
		// early queue pair took from the answer before.
		awaitPeerSegments(t, qp, 1)
		dst := make([]byte, 29)
		dmr := register(t, d, dst, AccessLocalWrite)
		if err := qp.PostSend(SendWR{ID: 3, Op: OpRead, Local: dst, LKey: dmr.LKey, Remote: uint64(tmr.Addr), RKey: tmr.RKey}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, qp.sendCQ); c.Status != StatusSuccess || !bytes.Equal(dst, target[:29]) {
			t.Fatalf("dial %d: RDMA Read %+v %q", i, c, dst)
		}
		if err := qp.Err(); err != nil {
			t.Fatalf("dial %d: queue pair failed: %v", i, err)
		}
		// An early dial names the listener's table and hub, which it
		// holds: the reply comes without fds (CM version 5).
		for !qp.Taken() {
			if err := qp.Err(); err != nil {
				t.Fatalf("dial %d: queue pair failed before its reply: %v", i, err)
			}
			runtime.Gosched()
		}
		if got, want := qp.Stats().HeldReplies, uint64(min(i, 1)); got != want {
			t.Fatalf("dial %d: %d replies without fds, want %d", i, got, want)
		}
		qp.Close()
		r.qp.Close()
	}
	// Without Early, a known listener is dialed the usual way.
	qp, err := d.Dial(ln.Addr().String(), QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), PrivateData: []byte("hello")})
	if err != nil || qp.Early() {
		t.Fatalf("a dial without Early: %v, early %v", err, qp != nil && qp.Early())
	}
	qp.Close()
	(<-accepted).qp.Close()
	// Another hello is another answer: not known.
	o := opts()
	o.PrivateData = []byte("other")
	if qp, err = d.Dial(ln.Addr().String(), o); err != nil || qp.Early() {
		t.Fatalf("a dial with another hello: %v, early %v", err, qp != nil && qp.Early())
	}
	qp.Close()
	(<-accepted).qp.Close()
}

// TestEarlyReplyWhileCopyWaits: an early queue pair's RDMA Write into
// the listener's memory, posted before the listener has answered, waits
// under the send queue's lock for the segment's announcement, which comes
// after the reply on the connection socket; the reader that takes the
// reply must not need that lock. It did (to count a reply without fds),
// and the write failed 10 s later with "never announced" (a soak of the
// sockets layer found it, one full run in four).
func TestEarlyReplyWhileCopyWaits(t *testing.T) {
	gate := make(chan struct{}, 1)
	ln, ld, accepted := gatedListener(t, nil, gate)
	target := alloc(t, ld, 4096)
	tmr := register(t, ld, target, AccessRemoteWrite)
	d := openDevice(t, nil)
	opts := QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), PrivateData: []byte("hello"), Early: true}
	gate <- struct{}{}
	qp, err := d.Dial(ln.Addr().String(), opts) // learns the answer
	if err != nil {
		t.Fatal(err)
	}
	r := <-accepted
	if r.err != nil {
		t.Fatal(r.err)
	}
	qp.Close()
	r.qp.Close()

	waiting := make(chan uint32, 1)
	hook := func(idx uint32) {
		select {
		case waiting <- idx:
		default:
		}
	}
	testHookSegmentWait.Store(&hook)
	defer testHookSegmentWait.Store(nil)
	opts.SendCQ, opts.RecvCQ = d.NewCQ(), d.NewCQ()
	qp, err = d.Dial(ln.Addr().String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	if !qp.Early() {
		t.Fatal("the second dial is not early: the test tests nothing")
	}
	src := []byte("written before the listener answered")
	smr := register(t, d, src, AccessLocalWrite)
	posted := make(chan error, 1)
	go func() {
		posted <- qp.PostSend(SendWR{ID: 7, Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(tmr.Addr), RKey: tmr.RKey})
	}()
	select {
	case <-waiting: // the write waits for the segment, holding the send queue
	case err := <-posted:
		t.Fatalf("the write did not wait for the listener's segment (PostSend: %v): the test tests nothing", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the write never began to wait for the listener's segment")
	}
	gate <- struct{}{} // now the reply, then the announcement
	r = <-accepted
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.qp.Close()
	var c [1]Completion
	n, err := qp.sendCQ.Wait(c[:], time.Now().Add(segmentWait/2))
	if err != nil || n != 1 {
		t.Fatalf("no completion of the write within %v (the reader stuck behind it?): %d, %v", segmentWait/2, n, err)
	}
	if c[0].Status != StatusSuccess || !bytes.Equal(target[:len(src)], src) {
		t.Fatalf("write %+v, target %q", c[0], target[:len(src)])
	}
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
}

// TestEarlyDialAnswerChanged: when the listener answers otherwise than
// before — another reply, or a reject — the early queue pair fails with
// a reason that says so, and the next dial is not early.
func TestEarlyDialAnswerChanged(t *testing.T) {
	for _, c := range []struct {
		name   string
		second func() ([]byte, error)
		want   error
		reason string
	}{
		{"other reply", func() ([]byte, error) { return []byte("changed"), nil }, ErrProtocol, "answered otherwise"},
		{"reject", func() ([]byte, error) { return nil, errors.New("no more room") }, ErrRefused, "no more room"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int32
			ln, _, accepted := earlyListener(t, func([]byte) ([]byte, error) {
				if calls.Add(1) == 2 {
					return c.second()
				}
				return []byte("first"), nil
			})
			d := openDevice(t, nil)
			opts := QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), Early: true}
			qp, err := d.Dial(ln.Addr().String(), opts)
			if err != nil {
				t.Fatal(err)
			}
			qp.Close()
			(<-accepted).qp.Close()
			opts.SendCQ, opts.RecvCQ = d.NewCQ(), d.NewCQ()
			qp, err = d.Dial(ln.Addr().String(), opts)
			if err != nil || !qp.Early() {
				t.Fatalf("second dial: %v, early %v", err, qp != nil && qp.Early())
			}
			defer qp.Close()
			if r := <-accepted; r.err == nil {
				r.qp.Close()
			}
			select {
			case <-qp.readerDone:
			case <-time.After(10 * time.Second):
				t.Fatal("the early queue pair still runs 10 s after a changed answer")
			}
			if err := qp.Err(); !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("queue pair error %v, want %v about %q", err, c.want, c.reason)
			}
			opts.SendCQ, opts.RecvCQ = d.NewCQ(), d.NewCQ()
			qp3, err := d.Dial(ln.Addr().String(), opts)
			if err == nil {
				if qp3.Early() {
					t.Error("the dial after a changed answer is early")
				}
				qp3.Close()
			}
		})
	}
}

// TestHeldReplyUnnamed: a reply that says the dialer holds the
// listener's files, to a hello that named none, is a protocol error.
func TestHeldReplyUnnamed(t *testing.T) {
	d := openDevice(t, nil)
	r := d.hello(0, nil)
	r.flags |= cmFlagHeld
	kp := &knownPeer{version: cmVersion, attr: d.Attr()}
	if err := checkReply(r.marshal(), nil, kp, false); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "named none") {
		t.Fatalf("a held reply to a hello that named nothing: %v", err)
	}
	if err := checkReply(r.marshal(), nil, kp, true); err != nil {
		t.Fatalf("a held reply to a hello that named the files: %v", err)
	}
}

// TestEarlyDialHostileReply: a listener on the address of a known one, in
// the same process (so that the early dial trusts it), that answers the
// hello with garbage, with the fds of another device, or not at all:
// the early queue pair fails with a protocol error that says so, never
// hangs past its timeout, and leaks nothing.
func TestEarlyDialHostileReply(t *testing.T) {
	other := openDevice(t, nil) // whose fds a lying listener passes
	for _, c := range []struct {
		name  string
		reply func(conn *net.UnixConn) // nil: never answers
		want  string
	}{
		{"garbage", func(conn *net.UnixConn) { conn.Write([]byte("no hello at all")) }, "handshake of 15 bytes"},
		{"another device's files", func(conn *net.UnixConn) {
			table, pipe := other.hub.Fds()
			sys.SendFds(conn, other.hello(0, nil).marshal(), other.regSeg.Fd(), table, pipe)
		}, "another registration table or hub"},
		{"held, with fds", func(conn *net.UnixConn) {
			h := other.hello(0, nil)
			h.flags |= cmFlagHeld
			table, pipe := other.hub.Fds()
			sys.SendFds(conn, h.marshal(), other.regSeg.Fd(), table, pipe)
		}, "a reply flagged as held with 3 fds"},
		{"silence", nil, "i/o timeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := testAddr()
			d := openDevice(t, nil)
			before := testutil.Snapshot()
			// The real listener first: its answer is remembered.
			ld := openDevice(t, nil)
			ln, err := ld.Listen(addr)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				if qp, err := ln.Accept(QPOptions{SendCQ: ld.NewCQ(), RecvCQ: ld.NewCQ()}); err == nil {
					qp.Close()
				}
			}()
			opts := QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), Early: true, Timeout: 200 * time.Millisecond}
			qp, err := d.Dial(addr, opts)
			if err != nil {
				t.Fatal(err)
			}
			qp.Close()
			ln.Close()
			// The liar, on the same name in the same process.
			raw, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			served := make(chan *net.UnixConn, 1)
			go func() {
				conn, err := raw.AcceptUnix()
				if err != nil {
					served <- nil
					return
				}
				buf := make([]byte, cmRecvSize)
				if _, fds, err := sys.RecvFds(conn, buf, cmMaxFds); err == nil {
					sys.CloseAll(fds)
				}
				if c.reply != nil {
					c.reply(conn)
				}
				served <- conn
			}()
			opts.SendCQ, opts.RecvCQ = d.NewCQ(), d.NewCQ()
			qp, err = d.Dial(addr, opts)
			if err != nil || !qp.Early() {
				t.Fatalf("the dial to the liar: %v, early %v", err, qp != nil && qp.Early())
			}
			select {
			case <-qp.readerDone:
			case <-time.After(10 * time.Second):
				t.Fatal("the early queue pair still runs 10 s after its reply was due")
			}
			if err := qp.Err(); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("queue pair error %v, want a protocol error about %q", err, c.want)
			}
			qp.Close()
			if conn := <-served; conn != nil {
				conn.Close()
			}
			raw.Close()
			ld.Close()
			d.Close()
			if err := before.CheckLeaks(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestEarlyDialsBounded: with maxEarlyOut early dials to a known listener
// that has not answered yet, the next dial waits for its reply, as a
// first dial does; it completes once the listener answers, and no early
// dial is left counted once the replies came.
func TestEarlyDialsBounded(t *testing.T) {
	ld := openDevice(t, nil)
	ln, err := ld.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	release := make(chan struct{})
	accepted := make(chan acceptResult, maxEarlyOut+2)
	go func() {
		first := true
		for {
			p, err := ln.AcceptPending()
			if err != nil {
				return
			}
			if !first {
				<-release // the listener answers nothing more until released
			}
			first = false
			qp, err := p.Handshake(QPOptions{SendCQ: ld.NewCQ(), RecvCQ: ld.NewCQ(), Answer: func(b []byte) ([]byte, error) { return b, nil }})
			accepted <- acceptResult{qp, err}
		}
	}()
	d := openDevice(t, nil)
	opts := func() QPOptions {
		return QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), PrivateData: []byte("hello"), Early: true, Timeout: time.Minute}
	}
	var qps []*QueuePair
	defer func() {
		for _, q := range qps {
			q.Close()
		}
	}()
	dial := func() *QueuePair {
		qp, err := d.Dial(ln.Addr().String(), opts())
		if err != nil {
			t.Fatal(err)
		}
		qps = append(qps, qp)
		return qp
	}
	dial() // learns the answer
	for i := range maxEarlyOut {
		if !dial().Early() {
			t.Fatalf("dial %d of %d to a known listener: not early", i+1, maxEarlyOut)
		}
	}
	reserved := make(chan bool, 1)
	testHookEarlyReserve = func(r bool) { reserved <- r }
	defer func() { testHookEarlyReserve = nil }()
	last := make(chan *QueuePair, 1)
	go func() {
		qp, err := d.Dial(ln.Addr().String(), opts())
		if err != nil {
			t.Error(err)
		}
		last <- qp
	}()
	if <-reserved {
		t.Fatalf("an early dial beyond the %d in flight", maxEarlyOut)
	}
	close(release)
	qp := <-last
	if qp == nil {
		t.FailNow()
	}
	qps = append(qps, qp)
	if qp.Early() {
		t.Fatal("the dial beyond the bound is early")
	}
	for range maxEarlyOut + 2 {
		if r := <-accepted; r.err != nil {
			t.Fatal(r.err)
		} else {
			defer r.qp.Close()
		}
	}
	// Every reply has been sent; the connection readers give the
	// reservations back as they take them.
	deadline := time.Now().Add(time.Minute)
	for d.earlyOut.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d early dials still counted after every reply was sent", d.earlyOut.Load())
		}
		runtime.Gosched()
	}
	for _, q := range qps {
		if err := q.Err(); err != nil {
			t.Fatalf("a queue pair failed: %v", err)
		}
	}
}
