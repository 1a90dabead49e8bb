package sockets

import (
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/gopool"
	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/pin"
)

// Conn is a connection over shared memory: a nic queue pair driven by the
// session protocol (docs/protocol.md). It implements net.Conn and is safe
// for concurrent use: Reads are serialized among themselves, so are
// Writes, and Read, Write, Close, CloseWrite and the deadline setters may
// be called from any goroutine at any time.
type Conn struct {
	cfg          Config
	dev          *device
	qp           *nic.QueuePair
	cq           *nic.CompletionQueue
	netw         string
	laddr, raddr net.Addr
	stats        stats
	owner        nic.Owner // the connection's cached registrations: flushed at teardown

	rdl, wdl deadline
	closing  chan struct{} // closed by Close
	kick     atomic.Uint32 // bumped when a waiting poller must look up
	tornDown chan struct{} // closed when teardown has released everything
	tearOnce sync.Once

	// lendMu serializes WriteTo calls: one lends received data at a time
	// (copy.go). Lock order: lendMu, then mu, then the device's and the
	// nic's locks.
	lendMu lockrank.Mutex

	// Bytes the Read (Write) in progress has delivered (accepted) so far,
	// for the error of a fault in its buffer (fault.go); the reader's
	// (writer's) gate's holder's.
	readN, writeN int
	// The message a Read's fast path is copying into the application's
	// buffer (fastread.go): endRead queues it if the copy faults.
	fast fastTake

	mu connMu // guards everything below (see connMu for which half)
	// The gates serialize Reads (rg: Read, WriteTo's lends) and Writes (wg:
	// Write, CloseWrite, ReadFrom's writes) for their whole call, waits
	// included; teardown holds both, and Close passes through them. rg is
	// the receive side's (mu.recv guards it), wg the send side's.
	rg, wg gate
	session
}

// connMu is the session's lock, one mutex per direction (docs/duplex.md).
// Lock and Unlock take and release both, receive side first: every path
// of the session runs under both, except the two fast paths, each under
// its own half alone, so that a Read and a Write in different goroutines
// go ahead without waiting for each other:
//   - a Write whose data messages the credits it holds carry now
//     (writeFastLocked) holds send: the ring to the peer, what we sent and
//     the acks it carried, the write gate;
//   - a Read that takes data messages from the ring (readFastLocked) holds
//     recv: the ring from the peer and its read and release positions,
//     the receive queue, the poller's role, the read gate.
//
// What one half's fast path writes and the other's reads crosses in
// published words (session.sent, ackSent, peerAck, ackPub: pub32). Every
// other field is written only under both halves, so either half alone may
// read it. A fast Read that meets anything else — a control message, a
// credit due, a failure — takes send too (upgradeLocked; the order allows
// it); a fast Write gives send back and takes both.
type connMu struct {
	recv lockrank.Mutex
	// The halves on cache lines of their own: each is taken by its own
	// direction's goroutine, on its own core.
	_    [cacheLine]byte
	send lockrank.Mutex
}

// cacheLine is the size of a cache line, at least, on the machines we run
// on.
const cacheLine = 64

func (m *connMu) init() {
	m.recv.Init(lockrank.ConnRecv)
	m.send.Init(lockrank.ConnSend)
}

// Lock takes both halves.
func (m *connMu) Lock() {
	m.recv.Lock()
	m.send.Lock()
}

// Unlock releases both halves.
func (m *connMu) Unlock() {
	m.send.Unlock()
	m.recv.Unlock()
}

// A gate lets one call of a direction in at a time, across the waits in
// which it releases Conn.mu; the others wait at it. It is Conn.mu's to
// guard: a call that finds it free takes it with the mu it holds anyway —
// a mutex per direction cost a locked instruction per Read and per Write
// (docs/performance.md, "Counters without locked adds").
type gate struct {
	busy bool
	free chan struct{} // closed when the holder leaves; nil while nobody waits
}

// enterLocked takes g, first waiting until it is free (mu released in the
// meantime); the caller holds mu, and holds it again when it returns.
func (g *gate) enterLocked(mu *connMu) {
	if g.busy {
		g.wait(mu)
	}
	g.busy = true
}

// wait waits until g is free, mu released in the meantime.
func (g *gate) wait(mu *connMu) {
	for g.busy {
		if g.free == nil {
			g.free = make(chan struct{})
		}
		ch := g.free
		mu.Unlock()
		<-ch
		mu.Lock()
	}
}

// leaveLocked frees g and lets its waiters try again; the caller holds mu.
func (g *gate) leaveLocked() {
	g.busy = false
	if g.free != nil {
		close(g.free)
		g.free = nil
	}
}

// Stats returns a snapshot of the connection's counters.
func (c *Conn) Stats() Counters { return c.stats.snapshot() }

// Monitor reports the monitor that tells this process's registration cache
// when application memory changes, and why the better ones do not run
// (pin.MonitorReport): without one, memory the peer reads in place is
// registered anew for every transfer. The eBPF monitor loads in the
// background once a connection first registers application memory (a
// transfer read from or into it in place; small messages never do), or
// when Monitor is called; Monitor waits for the load to finish. (A device
// without a registration cache would report MonitorNone.)
func (c *Conn) Monitor() pin.MonitorReport {
	if pc := c.dev.nic.Cache(); pc != nil {
		return pc.Monitor()
	}
	return pin.MonitorReport{Kind: pin.MonitorNone}
}

// LocalAddr returns the local address.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.setCheck("set deadline"); err != nil {
		return err
	}
	c.rdl.set(t)
	c.wdl.set(t)
	c.wake()
	return nil
}

// SetReadDeadline sets the deadline of Read calls, pending ones included.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if err := c.setCheck("set read deadline"); err != nil {
		return err
	}
	c.rdl.set(t)
	c.wake()
	return nil
}

// SetWriteDeadline sets the deadline of Write calls, pending ones included.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if err := c.setCheck("set write deadline"); err != nil {
		return err
	}
	c.wdl.set(t)
	c.wake()
	return nil
}

func (c *Conn) setCheck(op string) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return c.opErr(op, net.ErrClosed)
	}
	return nil
}

// opErr wraps err as the *net.OpError of op.
func (c *Conn) opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: c.netw, Source: c.laddr, Addr: c.raddr, Err: err}
}

// Read reads stream bytes into b. It returns io.EOF after the peer's
// graceful close, os.ErrDeadlineExceeded (wrapped) when the read deadline
// passes, net.ErrClosed after Close, an error matching
// syscall.ECONNRESET when the peer reset the connection, and one matching
// syscall.EFAULT after the bytes delivered when b's memory faulted.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.read(b)
	traceIO(c, ioRead, n, err) // tools/sdtrace: trace.go
	return n, c.opErr("read", err)
}

// Write writes b. Small writes travel inside control messages, large ones
// by rendezvous; short of locked memory, registrations or temporary
// memory, by a path that needs less (see the package documentation). A
// fault of b's memory returns the bytes accepted before it and an error
// matching syscall.EFAULT.
func (c *Conn) Write(b []byte) (int, error) {
	n, err := c.write(b)
	traceIO(c, ioWrite, n, err) // tools/sdtrace: trace.go
	return n, c.opErr("write", err)
}

// CloseWrite ends the stream towards the peer, which reads io.EOF after
// the data written so far. Reads go on.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	c.wg.enterLocked(&c.mu)
	defer func() {
		c.wg.leaveLocked()
		c.mu.Unlock()
	}()
	switch {
	case c.closed:
		return c.opErr("close", net.ErrClosed)
	case c.err != nil:
		return c.opErr("close", c.err)
	case c.wclosed:
		return nil
	}
	c.wclosed = true
	c.queueCtlLocked(ctlMsg{typ: msgFin})
	c.ensurePumpLocked()
	return nil
}

// Close closes the connection. Pending Reads and Writes return
// net.ErrClosed. What was written is still delivered: the connection
// lingers (Config.Linger at most) until the peer has consumed it, then
// releases its registrations and its queue pair — unless all of it, the
// end of the stream included, lies in the peer's ring already, which the
// peer reads to its end after we hang up: then it hangs up at once. A
// Close with received data left unread resets the connection instead, as
// TCP does.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	close(c.closing)
	c.wakeLocked()
	// Let the calls in flight return; later ones see closed.
	c.rg.enterLocked(&c.mu)
	c.wg.enterLocked(&c.mu)
	c.wg.leaveLocked()
	c.rg.leaveLocked()
	defer c.mu.Unlock()
	switch {
	case c.tearing:
	case c.err != nil || c.qpDead:
		c.teardownLocked()
	case c.unreadLocked():
		c.abortLocked(&abortError{err: errUnread})
	default:
		if !c.wclosed {
			c.wclosed = true
			c.queueCtlLocked(ctlMsg{typ: msgFin})
		}
		if c.deliveredLocked() {
			c.stats.count(cQuickCloses, 1)
			c.teardownLocked()
			break
		}
		c.tearing = true
		lingerStart()
		gopool.Go(c.linger)
	}
	return nil
}

// deliveredLocked tells whether a closing connection has nothing left to
// linger for: every message it wrote, its fin among them, lies in the
// peer's ring, which the peer reads to its end after we hang up (nic: a
// queue pair's committed sends come before its end), and nothing of ours
// is in use by the peer or waits for it — no rendezvous source (the peer
// reads it from our memory), no write or receive rendezvous, no piece
// copy under way. The peer must have taken the connection, too: an early
// dial that hangs up before its listener's reply may never be accepted,
// and what it wrote would be lost. Its reply checked (nic.QueuePair.Taken)
// says so, and so does any message the peer wrote into our ring, which it
// can only do once its handshake is through — a reply the connection
// reader has not got to yet. The linger's wait for the peer's ack
// of all this costs both sides a round trip and a wake-up, at the time a
// program that dials per request makes its next connection
// (docs/setup.md, "A close that waits for nothing").
func (c *Conn) deliveredLocked() bool {
	return len(c.ctlq) == 0 && len(c.txq) == 0 && c.wtx == nil && !c.rd.active &&
		c.copyInFlight == 0 && !c.lending && (c.received > 0 || c.qp.Taken())
}

// read is Read without the error wrapping.
func (c *Conn) read(b []byte) (n int, err error) {
	// The receive half alone (connMu): a Read that finds its data in the
	// ring takes it without the send half, which a Write in another
	// goroutine may hold.
	c.mu.recv.Lock()
	c.recvOnly = true
	if c.rg.busy {
		c.upgradeLocked()
		c.rg.wait(&c.mu)
	}
	c.rg.busy = true
	c.readN = 0
	// One return here keeps the defer open-coded: with readLoopLocked's
	// many returns it was a stack-allocated record, run through the
	// runtime's defer machinery on every Read (docs/performance.md,
	// "Read's defers"). It also ends the region in which a fault of b's
	// memory is recovered (fault.go).
	defer c.endRead(b, debug.SetPanicOnFault(true), &n, &err)
	if k, ok := c.readPlainLocked(b); ok {
		return k, nil
	}
	if len(b) > 0 && !c.polling && c.fastReadyLocked() {
		// Nothing came yet and nothing else is pending: the wait is all
		// there is to do, and it takes what it finds the fast way,
		// still without the send half (progressLocked's leave).
		perr := c.progressLocked(c.rounds, &c.rdl, true, true)
		if perr == nil {
			if k, ok := c.readPlainLocked(b); ok {
				return k, nil
			}
		}
		// The general path looks again: the error it finds comes from
		// the state (a deadline, Close, the end).
	}
	c.upgradeLocked()
	return c.readLoopLocked(b)
}

// readPlainLocked is a Read's fast path, under the receive half alone if
// that is what it holds: data queued first (readQueuedLocked), else data
// messages from the ring (readFastLocked), which may queue one larger
// than b.
func (c *Conn) readPlainLocked(b []byte) (int, bool) {
	if c.rxHead == len(c.rx) {
		if k, ok := c.readFastLocked(b); ok || c.rxHead == len(c.rx) {
			return k, ok
		}
	}
	if len(b) == 0 || !c.queuedReadyLocked() {
		return 0, false
	}
	k := c.readQueuedLocked(b)
	return k, k > 0
}

// unlockHeld releases what the caller holds of Conn.mu: both halves, or
// the receive half alone (recvOnly).
func (c *Conn) unlockHeld() {
	if c.recvOnly {
		c.recvOnly = false
		c.mu.recv.Unlock()
		return
	}
	c.mu.Unlock()
}

// readLoopLocked is read with c.mu held.
func (c *Conn) readLoopLocked(b []byte) (int, error) {
	n := 0
	for {
		// A direct receive writes into b: it must end before Read returns.
		direct := c.rd.active && c.rd.direct
		if !direct {
			var err error
			switch {
			case c.closed:
				err = net.ErrClosed
			case c.err != nil && !c.errDrain:
				err = c.err
			case n == 0 && c.rdl.expired.Load():
				err = os.ErrDeadlineExceeded
			}
			if err != nil {
				if n > 0 {
					return n, nil
				}
				return 0, err
			}
		}
		if len(b) == 0 {
			return 0, nil
		}
		consumed := c.consumed
		m, wait, err := c.readLocked(b, n)
		n = m
		if c.consumed != consumed {
			c.releaseLocked() // ring space, and the ack a fast Write carries
			c.pumpLocked()    // credit for what was consumed
		}
		switch {
		case err != nil:
			if n > 0 {
				return n, nil // the error comes again at the next Read
			}
			return 0, err
		case !wait:
			return n, nil
		case n > 0 && !c.rd.active:
			return n, nil
		case !c.rd.active && (c.err != nil || c.ringEnd):
			return 0, c.failureLocked() // nothing more can come
		}
		if c.pollInlineLocked() {
			continue
		}
		direct = c.rd.active && c.rd.direct
		dl := &c.rdl
		if direct {
			dl = nil // bounded: our own RDMA Read, or a sender serving our cts
		}
		fast := n == 0 && !direct
		perr := c.progressLocked(c.rounds, dl, !direct, fast)
		if fast && perr == nil {
			// What the wait found is in the ring still, if the fast
			// path may take it (progressLocked's leave), which may
			// have returned with mu's receive half alone.
			if k, ok := c.readFastLocked(b); ok {
				return k, nil
			}
		}
		c.upgradeLocked()
		if perr != nil && !direct {
			if n > 0 {
				return n, nil
			}
			return 0, perr
		}
	}
}

// write is Write without the error wrapping.
func (c *Conn) write(b []byte) (n int, err error) {
	// The send half alone (connMu) when the credits we hold carry all of
	// b now; otherwise both, and the write gate.
	c.mu.send.Lock()
	if !c.wg.busy && c.fastWritableLocked(len(b)) {
		c.sendOnly = true
	} else {
		c.mu.send.Unlock()
		c.mu.Lock()
		c.wg.enterLocked(&c.mu)
	}
	c.writeN = 0
	defer c.endWrite(b, debug.SetPanicOnFault(true), &n, &err) // fault.go
	if c.sendOnly {
		return c.writeFastLocked(b)
	}
	if err := c.writableLocked(); err != nil {
		return 0, err
	}
	if c.wdl.expired.Load() {
		return 0, os.ErrDeadlineExceeded
	}
	large := !c.eagerLocked(len(b))               // eager.go
	c.bigWrite = large && !c.dev.pinnable(len(b)) // lowmem.go
	c.waitedWrite = large && c.copyInFlight == 0  // copyChunk
	c.lw = c.waitedWrite && c.learnableLocked(b)  // policy.go: sourceLearner
	if c.lw {
		c.lwStart, c.lwBytes, c.lwMixed = time.Now(), len(b), false
		c.lwZC = c.learn.zeroCopy()
	}
	if large {
		// What the source choice learns from: is this the buffer of the
		// previous large write (the application reuses its buffers)?
		a := mem.Addr(b)
		c.reused = a >= c.lastWrite && a-c.lastWrite < c.lastWriteLen
		defer func() { c.lastWrite, c.lastWriteLen = a, uintptr(len(b)) }()
	}
	for n < len(b) {
		var m int
		c.writeN = n
		if rest := b[n:]; !large || len(rest) <= c.maxPayload {
			m, err = c.sendDataLocked(rest)
		} else {
			m, err = c.sendLargeLocked(rest)
		}
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// fastWritableLocked tells whether a write of n bytes may take the fast
// path, under the send half alone: the connection writable, and data
// messages that the credits we hold carry all of now (fitsLocked), so that
// it never waits.
func (c *Conn) fastWritableLocked(n int) bool {
	if n <= 0 || c.writeEndedLocked() || c.wdl.expired.Load() {
		return false
	}
	if n <= c.maxPayload {
		return len(c.ctlq) == 0 && c.canSendLocked(classData) // one message
	}
	return n <= c.cfg.EagerThreshold && c.fitsLocked(n)
}

// writeFastLocked writes b as data messages under the send half alone
// (sendOnly). What it cannot handle there — a queue pair that failed
// under it, a peer that broke the credit rules — it leaves to the general
// path: it takes both halves, keeping the write gate so that no other
// Write comes between its messages, and goes on there.
func (c *Conn) writeFastLocked(b []byte) (n int, err error) {
	c.bigWrite, c.waitedWrite, c.lw = false, false, false
	for n < len(b) {
		c.writeN = n
		m, err := c.sendDataLocked(b[n:])
		n += m
		if err == errNeedBoth {
			c.wg.busy = true
			c.sendOnly = false
			c.mu.send.Unlock()
			c.mu.Lock()
			return c.writeEagerLocked(b, n)
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeEagerLocked writes b from n on as data messages.
func (c *Conn) writeEagerLocked(b []byte, n int) (int, error) {
	for n < len(b) {
		c.writeN = n
		m, err := c.sendDataLocked(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeEndedLocked tells whether Write cannot go on (writableLocked says
// why).
func (c *Conn) writeEndedLocked() bool {
	return c.closed || c.err != nil || c.qpDead || c.wclosed
}

// writableLocked tells why Write cannot go on, or nil.
func (c *Conn) writableLocked() error {
	if !c.writeEndedLocked() {
		return nil
	}
	switch {
	case c.closed:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case c.qpDead:
		return c.failureLocked()
	case c.wclosed:
		return syscall.EPIPE
	}
	return nil
}

// unreadLocked tells whether received data is waiting for Read.
func (c *Conn) unreadLocked() bool {
	if len(c.staged) > 0 {
		return true
	}
	for i := c.rxHead; i < len(c.rx); i++ {
		if c.rx[i].kind != msgFin {
			return true
		}
	}
	return false
}

// wake makes waiting calls look at the state again (deadlines changed).
func (c *Conn) wake() {
	c.mu.Lock()
	c.wakeLocked()
	c.mu.Unlock()
}

// wakeLocked wakes the goroutines waiting for progress and a poller that
// spins or sleeps.
func (c *Conn) wakeLocked() {
	c.kick.Add(1)
	c.rounds++
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
	c.ringBellLocked()
}
