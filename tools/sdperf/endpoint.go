package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// endpoint is one side of a run: a device, its completion queues, the
// queue pair and three buffers. It is used by one goroutine.
//
//   - local: the source of sends and RDMA Writes, the destination of RDMA
//     Reads; registered for local write.
//   - remote: exposed to the peer for RDMA Write and Read. A message of
//     size s lives at its end, remote[len-s:], so its last byte is always
//     the last byte of the buffer: write_lat polls the 8-byte word there.
//   - rbuf: where every receive lands (all posted receives share it, as in
//     perftest); control messages are copied out before the repost.
type endpoint struct {
	cfg      *config
	dev      *nic.Device
	scq, rcq *nic.CompletionQueue
	qp       *nic.QueuePair

	local, remote, rbuf []byte
	lmr, rmr, rbmr      *nic.MemoryRegion

	peer    params
	peerLen int // the peer's buffer length: messages go to its end
	rxDepth int
	base    time.Time // timestamps are nanoseconds since base
	wseq    uint8     // write_lat: the last sequence byte exchanged

	cbuf [64]nic.Completion
	msg  [ctlMax]byte // the last control message
}

// peerName names the other side in errors.
func (e *endpoint) peerName() string {
	if e.cfg.server {
		return "client"
	}
	return "server"
}

// nextPow2 returns the smallest power of two ≥ n.
func nextPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

func deviceConfig(cfg *config) *nic.Config {
	c := nic.DefaultConfig()
	c.NoRDMARead = cfg.noRead
	// Busy polling is the tool's own loop of Poll; the device's waits
	// (where this side only waits for the peer, and the engine's wait for
	// ring room) spin briefly and then sleep, so a waiting side does not
	// take a CPU from the measuring one. With -e every wait sleeps.
	c.Wait = shm.DefaultWaitConfig()
	if cfg.events {
		c.Wait = shm.WaitConfig{Mode: shm.WaitBlock}
	}
	c.SendDepth = max(c.SendDepth, 2*txDepthBW)
	c.RecvDepth = max(c.RecvDepth, 2*rxDepthSend)
	if cfg.test.send() {
		// A send carries at most RingCapacity/2-16 bytes.
		c.RingCapacity = max(4<<20, nextPow2(2*(slices.Max(cfg.sizes)+16)))
	}
	return &c
}

// open opens the device and allocates and registers the buffers.
func (e *endpoint) open() error {
	var err error
	if e.dev, err = nic.Open(deviceConfig(e.cfg)); err != nil {
		return fmt.Errorf("open device: %w", err)
	}
	e.scq, e.rcq = e.dev.NewCQ(), e.dev.NewCQ()
	maxS := slices.Max(e.cfg.sizes)
	n := (max(maxS, 8) + 7) &^ 7
	if e.local, err = e.alloc(n); err != nil {
		return err
	}
	if e.remote, err = e.alloc(n); err != nil {
		return err
	}
	rb := ctlMax
	if e.cfg.test.send() {
		rb = max(rb, maxS)
	}
	if e.rbuf, err = e.alloc(rb); err != nil {
		return err
	}
	if e.lmr, err = e.dev.Register(e.local, nic.AccessLocalWrite); err != nil {
		return fmt.Errorf("register %d-byte buffer: %w", len(e.local), err)
	}
	if e.rmr, err = e.dev.RegisterRemote(e.remote, nic.AccessLocalWrite|nic.AccessRemoteRead|nic.AccessRemoteWrite); err != nil {
		return fmt.Errorf("register %d-byte buffer: %w", len(e.remote), err)
	}
	if e.rbmr, err = e.dev.Register(e.rbuf, nic.AccessLocalWrite); err != nil {
		return fmt.Errorf("register %d-byte buffer: %w", len(e.rbuf), err)
	}
	e.rxDepth = rxDepthRDMA
	if e.cfg.test.send() {
		e.rxDepth = rxDepthSend
	}
	return nil
}

// alloc returns n bytes of this side's memory kind, page-aligned.
func (e *endpoint) alloc(n int) ([]byte, error) {
	if e.cfg.memory == "shm" {
		b, err := e.dev.Alloc(n)
		if err != nil {
			return nil, fmt.Errorf("allocate %d bytes of device memory: %w", n, err)
		}
		return b, nil
	}
	const page = 4096
	b := make([]byte, n+page)
	off := int(-mem.Addr(b) & (page - 1))
	return b[off : off+n : off+n], nil
}

// close releases everything: the device frees its memory and queue pairs.
func (e *endpoint) close() {
	if e.dev != nil {
		e.dev.Close()
	}
}

// connect makes the queue pair: the server accepts one client on ln, the
// client dials.
func (e *endpoint) connect(ctx context.Context, ln *nic.Listener) error {
	opts := nic.QPOptions{SendCQ: e.scq, RecvCQ: e.rcq, Timeout: e.cfg.timeout}
	if opts.Timeout == 0 {
		opts.Timeout = time.Hour
	}
	var err error
	if ln == nil {
		if e.qp, err = e.dev.Dial(e.cfg.addr, opts); err != nil {
			return fmt.Errorf("connect to the server: %w", err)
		}
	} else {
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		e.qp, err = ln.Accept(opts)
		stop()
		ln.Close() // one run per server
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
	}
	for range e.rxDepth {
		if err := e.postRecv(); err != nil {
			return err
		}
	}
	return nil
}

func (e *endpoint) postRecv() error {
	if err := e.qp.PostRecv(nic.RecvWR{Buf: e.rbuf, LKey: e.rbmr.LKey}); err != nil {
		return e.qpErr("post receive", err)
	}
	return nil
}

// qpErr wraps a queue-pair failure, naming the peer if it went away.
func (e *endpoint) qpErr(what string, err error) error {
	if errors.Is(err, nic.ErrPeerGone) {
		return fmt.Errorf("%s: the %s went away (it failed or was stopped): %w", what, e.peerName(), err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (e *endpoint) now() int64 { return int64(time.Since(e.base)) }

// waitMode says how a wait for completions waits.
type waitMode int

const (
	// spin always polls. It is for short waits on the receive CQ across
	// which the peer may hang up. The device's sleeping wait checks the
	// rings (CompletionQueue.readyToWake → Consumer.Pending) without the
	// receive-queue lock under which the hang-up's last delivery
	// (readConn → progressRecv) moves the ring: a data race in nic that
	// -race reports. Poll takes that lock.
	spin waitMode = iota
	// active is the measuring loops' wait: busy polling, as perftest's
	// default, or with -e the device's sleeping wait.
	active
	// passive sleeps in the device's wait: this side only waits for the
	// peer and must not take a CPU from it.
	passive
)

// wait returns at least one completion of cq in out. bounded applies
// -timeout.
func (e *endpoint) wait(ctx context.Context, cq *nic.CompletionQueue, out []nic.Completion, mode waitMode, bounded bool, what string) ([]nic.Completion, error) {
	var deadline time.Time
	if bounded && e.cfg.timeout > 0 {
		deadline = time.Now().Add(e.cfg.timeout)
	}
	if mode == spin || mode == active && !e.cfg.events {
		for i := 1; ; i++ {
			if n := cq.Poll(out); n > 0 {
				return out[:n], nil
			}
			if i%4096 == 0 {
				if err := e.check(ctx, deadline, what); err != nil {
					return nil, err
				}
			}
		}
	}
	for {
		slice := time.Now().Add(100 * time.Millisecond) // bounds how late a cancellation is seen
		if !deadline.IsZero() && deadline.Before(slice) {
			slice = deadline
		}
		n, err := cq.Wait(out, slice)
		if n > 0 {
			return out[:n], nil
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, e.qpErr(what, err)
		}
		if err := e.check(ctx, deadline, what); err != nil {
			return nil, err
		}
	}
}

// check reports a cancellation, a deadline passed, or a failed queue pair.
func (e *endpoint) check(ctx context.Context, deadline time.Time, what string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if e.qp.State() == nic.QPError {
		return e.qpErr(what, e.qp.Err())
	}
	if !deadline.IsZero() && time.Now().After(deadline) {
		return fmt.Errorf("%s: nothing from the %s for %v (-timeout)", what, e.peerName(), e.cfg.timeout)
	}
	return nil
}

// reapSends checks send-queue completions.
func (e *endpoint) reapSends(cs []nic.Completion) error {
	for i := range cs {
		if err := cs[i].Err(); err != nil {
			return e.qpErr(cs[i].Op.String()+" completion", err)
		}
	}
	return nil
}

// waitSends waits for n send-queue completions.
func (e *endpoint) waitSends(ctx context.Context, n int, mode waitMode) error {
	for n > 0 {
		cs, err := e.wait(ctx, e.scq, e.cbuf[:min(n, len(e.cbuf))], mode, true, "wait for a send-queue completion")
		if err != nil {
			return err
		}
		if err := e.reapSends(cs); err != nil {
			return err
		}
		n -= len(cs)
	}
	return nil
}

// recv waits for the next incoming message, copies at most ctlMax bytes
// of it to e.msg, reposts its receive, and returns the copy and the
// message's length. Every receive lands in rbuf, and a poll may move
// several messages: a control message stays intact only because it is the
// last thing its sender sends before it waits for an answer. The copy is
// made before the repost, whose lock orders it before any later delivery
// into rbuf (the connection's reader delivers too, when the peer hangs up).
func (e *endpoint) recv(ctx context.Context, mode waitMode, bounded bool, what string) ([]byte, int, error) {
	cs, err := e.wait(ctx, e.rcq, e.cbuf[:1], mode, bounded, what)
	if err != nil {
		return nil, 0, err
	}
	c := cs[0]
	if err := c.Err(); err != nil {
		return nil, 0, e.qpErr(what, err)
	}
	m := append(e.msg[:0], e.rbuf[:min(c.Bytes, ctlMax)]...)
	// A failure here (the peer closed after its last message) shows in
	// the next wait, which sees the queue pair in the error state.
	e.qp.PostRecv(nic.RecvWR{Buf: e.rbuf, LKey: e.rbmr.LKey})
	return m, c.Bytes, nil
}

// recvCtl receives a control message.
func (e *endpoint) recvCtl(ctx context.Context, mode waitMode, bounded bool, what string) ([]byte, error) {
	m, n, err := e.recv(ctx, mode, bounded, what)
	if err == nil && n > ctlMax {
		err = fmt.Errorf("%s: %w: %d bytes", what, errBadMessage, n)
	}
	return m, err
}

// sendCtl sends a control message and waits for its completion.
func (e *endpoint) sendCtl(ctx context.Context, b []byte) error {
	if err := e.qp.PostSend(nic.SendWR{Op: nic.OpSend, Local: b}); err != nil {
		return e.qpErr("send control message", err)
	}
	return e.waitSends(ctx, 1, passive) // the send CQ drives no receives: no race
}

// exchange swaps parameters with the peer (the client speaks first) and
// checks that both describe the same run and that a read test has RDMA
// Read on both devices.
func (e *endpoint) exchange(ctx context.Context) error {
	mine := e.params()
	var theirs []byte
	var err error
	if !e.cfg.server {
		if err := e.sendCtl(ctx, mine.marshal()); err != nil {
			return err
		}
	}
	if theirs, err = e.recvCtl(ctx, spin, true, "wait for the "+e.peerName()+"'s parameters"); err != nil {
		return err
	}
	p, perr := parseParams(theirs)
	if e.cfg.server {
		// Answer even a mismatch: the client then fails with the same words.
		if err := e.sendCtl(ctx, mine.marshal()); err != nil {
			return err
		}
	}
	if perr != nil {
		return fmt.Errorf("%s's parameters: %w", e.peerName(), perr)
	}
	if !sameRun(&mine, &p) {
		client, server := p.words(), mine.words()
		if !e.cfg.server {
			client, server = server, client
		}
		return fmt.Errorf("parameters differ: the client runs %q, the server %q; start both with the same test, sizes and -n", client, server)
	}
	e.peer = p
	e.peerLen = int(p.bufLen)
	if e.cfg.test.read() {
		if !e.dev.Attr().RDMARead {
			return fmt.Errorf("%v needs RDMA Read, but this side's device has none (--no-read): %w", e.cfg.test, nic.ErrNotSupported)
		}
		if !e.qp.PeerAttr().RDMARead {
			return fmt.Errorf("%v needs RDMA Read, but the %s's device has none (started with --no-read): %w", e.cfg.test, e.peerName(), nic.ErrNotSupported)
		}
	}
	return nil
}

func (e *endpoint) params() params {
	p := params{
		test:    e.cfg.test,
		iters:   uint64(e.cfg.iters),
		bufAddr: uint64(e.rmr.Addr),
		rkey:    e.rmr.RKey,
		bufLen:  uint64(len(e.remote)),
		sizes:   e.cfg.sizes,
	}
	if e.cfg.memory == "shm" {
		p.flags |= flagShm
	}
	if e.cfg.events {
		p.flags |= flagEvents
	}
	return p
}

// runTest runs one side of the test described by cfg.
func runTest(ctx context.Context, stdout io.Writer, cfg *config) (err error) {
	e := &endpoint{cfg: cfg, base: time.Now()}
	defer e.close()
	if err := e.open(); err != nil {
		return err
	}
	var ln *nic.Listener
	if cfg.server {
		if ln, err = e.dev.Listen(cfg.addr); err != nil {
			return err
		}
		defer ln.Close()
		fmt.Fprint(stdout, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
		fmt.Fprintf(stdout, "sdperf: %s server listening on %s\n", cfg.test, ln.Addr())
	}
	if err := e.connect(ctx, ln); err != nil {
		return err
	}
	if err := e.exchange(ctx); err != nil {
		return err
	}
	printInfo(stdout, &info{
		server:    cfg.server,
		local:     e.params(),
		peer:      e.peer,
		localPID:  os.Getpid(),
		peerPID:   e.qp.PeerPID(),
		localRead: e.dev.Attr().RDMARead,
		peerRead:  e.qp.PeerAttr().RDMARead,
		maxInline: e.dev.Attr().MaxInline,
	})
	// The measuring goroutine keeps its thread, as a C benchmark would.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	posted := make([]int64, cfg.iters)
	var completed []int64
	if !cfg.test.lat() {
		completed = make([]int64, cfg.iters)
	}
	for _, size := range cfg.sizes {
		var r row
		var err error
		if cfg.server {
			r, err = e.serveSize(ctx, size, posted, completed)
		} else {
			r, err = e.runSize(ctx, size, posted, completed)
		}
		if err != nil {
			return fmt.Errorf("%v, %d bytes: %w", cfg.test, size, err)
		}
		printRow(stdout, &r)
	}
	fmt.Fprint(stdout, resultLine)
	return e.goodbye(ctx)
}

// goodbye ends a run: the client says bye and closes; the server closes
// once it has the bye. So neither side hangs up while the other still
// waits for a message, and the server's wait for the bye polls (spin).
func (e *endpoint) goodbye(ctx context.Context) error {
	if !e.cfg.server {
		return e.sendCtl(ctx, byeMsg())
	}
	m, err := e.recvCtl(ctx, spin, true, "wait for the client's bye")
	if err != nil {
		return err
	}
	return parseBye(m)
}

// runSize is the client's part of one size: measure, send the row, and
// wait until the server is ready for the next size.
func (e *endpoint) runSize(ctx context.Context, size int, posted, completed []int64) (row, error) {
	var r row
	var err error
	switch e.cfg.test {
	case sendLat:
		err = e.sendPingPong(ctx, size, posted, true)
		r = latRow(size, posted, 2)
	case writeLat:
		err = e.writePingPong(ctx, size, posted, true)
		r = latRow(size, posted, 2)
	case readLat:
		err = e.readLatency(ctx, size, posted)
		r = latRow(size, posted, 1)
	default:
		err = e.stream(ctx, size, posted, completed)
		r = bwRow(size, posted, completed)
	}
	if err != nil {
		return r, err
	}
	if err := e.sendCtl(ctx, r.marshal()); err != nil {
		return r, err
	}
	m, err := e.recvCtl(ctx, active, true, "wait for the server to finish the size")
	if err != nil {
		return r, err
	}
	return r, parseReady(m, size)
}

// serveSize is the server's part of one size: take part in the timing or
// serve memory, read the client's row, and report ready. It returns the
// row the server prints.
func (e *endpoint) serveSize(ctx context.Context, size int, posted, completed []int64) (row, error) {
	var mine row
	own := true
	var err error
	switch e.cfg.test {
	case sendLat:
		err = e.sendPingPong(ctx, size, posted, false)
		mine = latRow(size, posted, 2)
	case writeLat:
		err = e.writePingPong(ctx, size, posted, false)
		mine = latRow(size, posted, 2)
	case sendBW:
		err = e.receiveStream(ctx, size, completed)
		mine = recvRow(size, completed)
	default:
		own = false // the client's one-sided operations: nothing to time here
	}
	if err != nil {
		return mine, err
	}
	// While the client runs a one-sided size, this wait sleeps and has no
	// time limit.
	mode := active
	if !own {
		mode = passive
	}
	m, err := e.recvCtl(ctx, mode, own, "wait for the client's results")
	if err != nil {
		return mine, err
	}
	theirs, err := parseRow(m)
	if err != nil {
		return mine, err
	}
	if theirs.size != size || theirs.iters != e.cfg.iters {
		return mine, fmt.Errorf("%w: client's row for %d bytes × %d", errBadMessage, theirs.size, theirs.iters)
	}
	if err := e.sendCtl(ctx, readyMsg(size)); err != nil {
		return mine, err
	}
	if own {
		return mine, nil
	}
	return theirs, nil
}
