package sockets

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// Work request ids: the kind in the top byte, an index below.
const (
	wrRecv  uint64 = 1 << 56
	wrSend  uint64 = 2 << 56
	wrRead  uint64 = 3 << 56
	wrWrite uint64 = 4 << 56
	wrBell  uint64 = 5 << 56
	// An inline send, unsignaled: its buffer is free when PostSend
	// returns; only a failure completes.
	wrSendInline uint64 = 6 << 56
	wrKind       uint64 = 0xff << 56
)

var (
	errUnread   = errors.New("closed with unread data")
	errLateData = errors.New("data arrived after close")
)

// progress polls the completion queue once, waiting as the configuration
// says, and dispatches what it finds; or, when another goroutine polls,
// waits for that one's next round. It returns os.ErrDeadlineExceeded when
// dl passes (nil: no deadline) and net.ErrClosed after Close if
// stopOnClose. The caller holds no lock and rechecks its condition; gen
// is c.rounds when it checked, under mu: when a round ended since, the
// condition may hold already and progress returns at once (waiting then
// would miss the wake-up: a cts dispatched by another poller while the
// writer was between its check and its wait hung the write rendezvous).
func (c *Conn) progress(gen uint32, dl *deadline, stopOnClose bool) error {
	return c.progressMode(gen, dl, stopOnClose, false)
}

// progressMode is progress. nap is ignored: goroutines that wait through
// a hang-up (linger, the pump, the handshake) once polled with naps, when
// a hang-up drained the receive ring under a waiter's feet; an in-place
// ring is the poller's alone.
func (c *Conn) progressMode(gen uint32, dl *deadline, stopOnClose, nap bool) error {
	c.mu.Lock()
	if c.torn {
		c.mu.Unlock()
		return net.ErrClosed
	}
	if c.rounds != gen {
		c.mu.Unlock()
		return nil // the state changed since the caller looked
	}
	if c.polling {
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		ch := c.changed
		c.mu.Unlock()
		var dch, cch chan struct{}
		if dl != nil {
			dch = dl.wait()
		}
		if stopOnClose {
			cch = c.closing
		}
		select {
		case <-ch:
			return nil
		case <-dch:
			return os.ErrDeadlineExceeded
		case <-cch:
			return net.ErrClosed
		}
	}
	c.polling = true
	c.interesting = false
	k := c.kick.Load()
	c.mu.Unlock()
	var err error
	for {
		var n int
		n, err = c.pollCQ(dl, k)
		c.mu.Lock()
		c.dispatchPolledLocked(n)
		// Completions of our own sends change nothing a caller waits
		// for, unless it waits for a send buffer: poll on.
		if c.interesting || c.wantSend || n == 0 || err != nil || c.changed != nil || c.kick.Load() != k {
			break
		}
		c.mu.Unlock()
	}
	c.endPollLocked()
	c.mu.Unlock()
	return err
}

// dispatchPolledLocked dispatches the first n completions of c.comps, the
// poller's, and sends what they made due.
func (c *Conn) dispatchPolledLocked(n int) {
	for i := 0; i < n; i++ {
		c.dispatchLocked(&c.comps[i])
		c.comps[i] = nic.Completion{}
	}
	if c.drainLocked() || n > 0 {
		c.pumpLocked()
	}
}

// drainLocked handles the messages that have come in the ring, and tells
// whether there were any. Only the poller calls it: it alone moves the
// ring's read position, which a waiting poller looks at without mu.
func (c *Conn) drainLocked() bool {
	got := false
	for !c.torn && !c.qpDead {
		data, end, ok, err := c.qp.RecvInPlace()
		if err != nil {
			c.qpFailedLocked(err)
			break
		}
		if !ok {
			break
		}
		got = true
		start := c.inPos
		c.inPos = end
		c.taken++
		c.interesting = true
		c.onRecvLocked(data, start)
	}
	c.releaseLocked()
	return got
}

// releaseLocked gives the peer back the ring space of the messages before
// the first one the application has not read. When handled messages wait
// behind unread data (a control message behind data nobody reads yet), the
// unread bytes move to the heap and all of it goes back: the peer's
// control messages must always find room, and what the application does
// not read still holds its credit, so the heap holds at most a window.
func (c *Conn) releaseLocked() {
	if c.torn || c.relPos == c.inPos {
		return
	}
	to := c.inPos
	for i := c.rxHead; i < len(c.rx); i++ {
		if e := &c.rx[i]; e.held {
			to = e.start
			break
		}
	}
	if c.lending {
		// Nothing from the lent message on goes back (and spilling would
		// not change that): acks stop at lendAck meanwhile.
		to = min(to, c.lendStart)
	} else if to != c.inPos && c.blockedLocked() {
		c.spillLocked()
		to = c.inPos
	}
	if to > c.relPos {
		c.qp.ReleaseRecv(to)
		c.relPos = to
	}
}

// blockedLocked tells whether a handled message waits behind unread data:
// more messages were taken since the first held entry than are held.
func (c *Conn) blockedLocked() bool {
	for i := c.rxHead; i < len(c.rx); i++ {
		if e := &c.rx[i]; e.held {
			return c.taken-e.seq > uint64(c.heldN)
		}
	}
	return false
}

// holdLocked makes e, about to be queued, hold the ring space of the
// message just taken from position start.
func (c *Conn) holdLocked(e *rxEntry, start uint64) {
	e.held, e.start, e.seq = true, start, c.taken-1
	c.heldN++
}

// unholdLocked ends e's hold (read, or moved to the heap).
func (c *Conn) unholdLocked(e *rxEntry) {
	if e.held {
		e.held = false
		c.heldN--
	}
}

// pushRxLocked queues e. The queue is read from rxHead; when it is full,
// the entries already read go first, so that a queue that never empties
// (a reader a message behind the writer) keeps its size and allocates
// nothing. No pointer into it lives across a release of mu. Every entry
// holds a credit until it is read, so a window of them is all there can
// be: the first one makes room for that many.
func (c *Conn) pushRxLocked(e rxEntry) {
	if c.rx == nil {
		c.rx = make([]rxEntry, 0, c.window)
	}
	if len(c.rx) == cap(c.rx) && c.rxHead > 0 {
		n := copy(c.rx, c.rx[c.rxHead:])
		clear(c.rx[n:])
		c.rx, c.rxHead = c.rx[:n], 0
	}
	c.rx = append(c.rx, e)
}

// spillLocked moves the unread bytes of held entries to the heap.
func (c *Conn) spillLocked() {
	for i := c.rxHead; i < len(c.rx); i++ {
		if e := &c.rx[i]; e.held {
			e.data = bytes.Clone(e.data)
			c.unholdLocked(e)
			c.stats.count(cSpills, 1)
		}
	}
}

// endPollLocked ends a poller's round and wakes the calls that waited for
// it.
func (c *Conn) endPollLocked() {
	c.polling = false
	c.rounds++
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// pollNowLocked takes the completions that are there, if no other call
// is polling, and dispatches them; it never waits. It releases mu while it
// polls (the nic may run queued RDMA work then).
func (c *Conn) pollNowLocked() {
	if c.polling || c.torn {
		return
	}
	c.polling = true
	c.mu.Unlock()
	n := c.cq.Poll(c.comps[:])
	c.mu.Lock()
	c.dispatchPolledLocked(n)
	c.endPollLocked()
}

// pollCQ waits for completions into c.comps. The caller is the poller;
// k is the kick count it started with: a change ends the wait.
func (c *Conn) pollCQ(dl *deadline, k uint32) (int, error) {
	comps := c.comps[:]
	if n := c.cq.Poll(comps); n > 0 || c.qp.RecvPending() {
		return n, nil
	}
	if c.replyLook && c.replyDue.Swap(false) {
		if n, ok := c.awaitReply(comps, dl, k); ok {
			c.stats.count(cRepliesCaught, 1)
			return n, nil
		}
	}
	var t time.Time
	if dl != nil {
		t = dl.when()
	}
	c.mu.Lock()
	c.repostLocked() // the peer's next message must find a buffer
	c.sleeping = true
	c.mu.Unlock()
	var n int
	var err error
	if c.kick.Load() == k && !(dl != nil && dl.expired.Load()) {
		c.stats.count(cSleeps, 1)
		var how shm.Outcome
		n, how, err = c.cq.WaitOutcome(comps, t)
		switch how {
		case shm.WaitedSpun:
			c.stats.count(cWaitsSpun, 1)
		case shm.WaitedSlept:
			c.stats.count(cWaitsParked, 1)
		}
	}
	c.mu.Lock()
	c.sleeping = false
	c.repostLocked()
	c.mu.Unlock()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if dl != nil && dl.expired.Load() {
				return 0, os.ErrDeadlineExceeded
			}
			return 0, nil // the deadline moved
		}
		return 0, err
	}
	return n, nil
}

// awaitReply polls for Config.ReplyWait, in block mode, after this side
// sent a message: the answer to it may be on its way, and finding it costs
// less than a sleep and a wake-up. It spins (shm.WaitStrategy, busy) and
// returns how many completions it took and whether anything came (a
// message in the ring, or completions); false when the wait was kicked,
// its deadline passed or nothing came. The caller is the poller.
func (c *Conn) awaitReply(comps []nic.Completion, dl *deadline, k uint32) (int, bool) {
	c.reply = replyLook{c: c, comps: comps, dl: dl, k: k}
	c.replySpin.Wait(&c.reply, nil, time.Now().Add(c.cfg.ReplyWait))
	r := c.reply
	c.reply = replyLook{}
	return r.n, r.got
}

// replyLook is awaitReply's wait: a poll of the completion queue and the
// ring, ended early by a kick or the deadline.
type replyLook struct {
	c     *Conn
	comps []nic.Completion
	dl    *deadline
	k     uint32
	n     int
	got   bool
}

func (r *replyLook) Ready() bool {
	c := r.c
	if r.n = c.cq.Poll(r.comps); r.n > 0 || c.qp.RecvPending() {
		r.got = true
		return true
	}
	return c.kick.Load() != r.k || r.dl != nil && r.dl.expired.Load()
}

func (r *replyLook) Arm(uint32) {} // it never parks

// repostLocked gives back the ring space of what was read.
func (c *Conn) repostLocked() { c.releaseLocked() }

// ringBellLocked wakes the poller waiting in CompletionQueue.Wait (it
// spins or is parked there).
func (c *Conn) ringBellLocked() {
	if c.sleeping {
		c.stats.count(cDoorbells, 1)
		c.cq.Wake()
	}
}

// credits returns how many more messages the peer can take now.
func (c *Conn) creditsLocked() uint32 { return c.peerWindow - (c.sent - c.peerAck) }

// Message classes: how many credits a message needs. Data keeps two
// credits back, a control message one, so that data can never starve
// control messages (done, cts, cancel, fin) and nothing can starve credit
// messages: see docs/protocol.md.
type class uint32

const (
	classCredit  class = 1 // credit, abort
	classControl class = 2 // cts, done, cancel, fin
	classData    class = 3 // data, rts
)

func classOf(t msgType) class {
	switch t {
	case msgData, msgRTS:
		return classData
	case msgCredit, msgAbort:
		return classCredit
	}
	return classControl
}

// canSendLocked tells whether a message of class k may go now: a free
// send buffer and the credits its class needs.
func (c *Conn) canSendLocked(k class) bool {
	if c.qpDead || c.torn || !c.helloDone {
		return false
	}
	return c.creditsLocked() >= uint32(k)
}

// sendLocked sends one control message built from h and payload; the
// caller checked canSendLocked. It fills in the ack.
func (c *Conn) sendLocked(h *header, payload []byte) error {
	// The ack below gives the peer credit for what we are done with:
	// their ring space must be free first.
	c.releaseLocked()
	ack := c.ackableLocked()
	h.SetAck(ack)
	h.SetLen(uint32(len(payload)))
	n := headerSize + len(payload)
	// Straight into the ring to the peer: one copy, no completion. The
	// credits guarantee room (the ring holds a window of our largest
	// messages); a peer that lies about what it released runs out of it.
	buf, err := c.qp.ReserveSend(n)
	if err != nil {
		if errors.Is(err, nic.ErrRingFull) {
			c.abortLocked(protoErr("no room in the ring with %d credits left: the peer holds what it acknowledged", c.creditsLocked()))
			return c.writableLocked()
		}
		c.qpFailedLocked(err)
		return c.writableLocked()
	}
	copy(buf, h[:])
	// The payload may be application memory that faults (fault.go): the
	// reservation is given back if it does (abandonSendLocked).
	c.reserved = true
	copy(buf[headerSize:], payload)
	c.reserved = false
	if err := c.qp.CommitSend(n); err != nil {
		c.qpFailedLocked(err)
		return c.writableLocked()
	}
	if c.replyLook {
		c.replyDue.Store(true) // a locked instruction: only where it is read
	}
	c.sent++
	if h.Type() != msgCredit {
		c.lastNonCredit = c.sent
	} else {
		c.stats.count(cCreditMsgs, 1)
	}
	c.ackSent = ack
	if ack == c.consumed {
		c.owed = 0
	}
	c.stats.count(cMsgsSent, 1)
	return nil
}

// queueCtlLocked queues a control message; pumpLocked sends it when a
// credit allows, in order.
func (c *Conn) queueCtlLocked(m ctlMsg) {
	c.ctlq = append(c.ctlq, m)
	c.pumpLocked()
}

// pumpLocked sends queued control messages and an explicit credit
// message when one is due.
func (c *Conn) pumpLocked() {
	for len(c.ctlq) > 0 && c.canSendLocked(classControl) {
		m := c.ctlq[0]
		var h header
		h.SetType(m.typ)
		h.SetFlags(m.flags)
		h.SetID(m.id)
		h.SetSize(m.size)
		h.SetOffset(m.off)
		h.SetAddr(m.addr)
		h.SetRKey(m.rkey)
		if c.sendLocked(&h, nil) != nil {
			return
		}
		c.ctlq = c.ctlq[1:]
	}
	if len(c.ctlq) == 0 {
		c.ctlq = c.ctlq[:0]
	}
	// Return credit at half the window; or, for a consumed message other
	// than a credit, when the peer is out of credit for control messages
	// or closing, or we are closing (the closer waits for our ack).
	unacked := c.ackableLocked() - c.ackSent
	starved := c.window-(c.received-c.ackSent) < uint32(classControl)
	due := unacked > 0 && (unacked >= c.window/2 || (c.owed > 0 && (starved || c.peerFin || c.closed)))
	// The peer's credit messages can eat the credits it keeps for control
	// messages: when it is starved and an ack would give some back, and
	// we have credits to spare (so two starved sides never trade credit
	// messages), acknowledge them. Without this, a peer that spent its
	// last credits on credit messages could never send the done our
	// zero-copy write waits for (an echo hung so).
	if !due && unacked > 0 && starved && c.creditsLocked() > uint32(classControl) {
		due = true
	}
	if due && c.canSendLocked(classCredit) {
		var h header
		h.SetType(msgCredit)
		c.sendLocked(&h, nil)
	}
}

// ackableLocked is the ack our next message may carry: what we consumed,
// or while received data is lent (copy.go) what we had consumed when the
// lend began — the ring space of what came since is not given back yet.
func (c *Conn) ackableLocked() uint32 {
	if c.lending {
		return c.lendAck
	}
	return c.consumed
}

// consumeLocked counts a message we are done with: its credit goes back
// to the peer with our next ack (its ring space first: releaseLocked).
func (c *Conn) consumeLocked(credit bool) {
	c.consumed++
	if !credit {
		c.owed++
	}
}

// dispatchLocked handles one completion: the queue pair's own RDMA work
// (messages come in the ring: drainLocked).
func (c *Conn) dispatchLocked(comp *nic.Completion) {
	switch comp.ID & wrKind {
	case wrRead, wrWrite:
		c.interesting = true
		c.onRDMALocked(comp)
	case wrBell:
		c.interesting = true
		if comp.Status != nic.StatusSuccess {
			c.qpFailedLocked(comp.Err())
		}
	default:
		c.interesting = true
		c.qpFailedLocked(comp.Err())
	}
}

// onRecvLocked handles a message the peer sent, msg, where it lies in the
// ring from position start.
func (c *Conn) onRecvLocked(msg []byte, start uint64) {
	if c.err != nil && !c.errDrain {
		return // aborted: nothing more is read
	}
	if len(msg) > c.bufSize {
		c.abortLocked(protoErr("message of %d bytes, larger than our %d-byte messages", len(msg), c.bufSize))
		return
	}
	h, payload, err := parseMessage(msg)
	if err != nil {
		c.abortLocked(protoErr("malformed message: %v", err))
		return
	}
	c.stats.count(cMsgsReceived, 1)
	t := h.Type()
	if !c.helloDone {
		c.onFirstLocked(&h, payload)
		return
	}
	if !c.creditedLocked(&h) {
		return
	}
	switch t {
	case msgHello:
		c.abortLocked(protoErr("second hello"))
	case msgData:
		c.onDataLocked(payload, start)
	case msgRTS:
		c.onRTSLocked(start, &h, payload)
	case msgCTS:
		c.onCTSLocked(&h)
		c.consumeLocked(false)
	case msgDone:
		c.onDoneLocked(&h)
		c.consumeLocked(false)
	case msgCancel:
		c.onCancelLocked(&h)
		c.consumeLocked(false)
	case msgCredit:
		c.consumeLocked(true)
	case msgFin:
		c.onFinLocked()
	case msgAbort:
		c.resetLocked(&resetError{reason: string(payload)})
	}
}

// onFirstLocked handles the peer's first message, which must be its hello
// (or an abort that says why it refuses us).
func (c *Conn) onFirstLocked(h *header, payload []byte) {
	switch t := h.Type(); t {
	case msgHello:
		c.received++
		c.onHelloLocked(h, payload)
		c.consumeLocked(true)
	case msgAbort:
		c.resetLocked(&resetError{reason: string(payload)})
	default:
		c.abortLocked(protoErr("first message is %v, not hello", t))
	}
}

// creditedLocked counts a message that came and takes its ack, and
// aborts the connection if the peer had no credit for it or acknowledges
// messages never sent. Credits: the peer may have at most window messages
// unacknowledged, the last two of which only for control and credit
// messages, the last one only for credit messages and aborts.
func (c *Conn) creditedLocked(h *header) bool {
	t := h.Type()
	limit := c.window - uint32(classOf(t)) + 1
	if c.received-c.ackSent >= limit {
		c.abortLocked(protoErr("%v sent without credit: %d unacknowledged, window %d", t, c.received-c.ackSent+1, c.window))
		return false
	}
	c.received++
	ack := h.Ack()
	if ack-c.peerAck > c.sent-c.peerAck {
		c.abortLocked(protoErr("ack %d of messages never sent (sent %d, acked %d)", ack, c.sent, c.peerAck))
		return false
	}
	c.peerAck = ack
	return true
}

// onDataLocked queues eager data for Read, where it lies in the ring.
func (c *Conn) onDataLocked(payload []byte, start uint64) {
	switch {
	case c.closed:
		c.abortLocked(&abortError{err: errLateData})
	case c.peerFin:
		c.abortLocked(protoErr("data after fin"))
	default:
		e := rxEntry{kind: msgData, data: payload}
		c.holdLocked(&e, start)
		c.pushRxLocked(e)
	}
}

// onFinLocked records the end of the peer's stream.
func (c *Conn) onFinLocked() {
	if c.peerFin {
		c.abortLocked(protoErr("second fin"))
		return
	}
	c.peerFin = true
	c.pushRxLocked(rxEntry{kind: msgFin})
	c.consumeLocked(false)
}

func (c *Conn) onHelloLocked(h *header, payload []byte) {
	m, err := parseHello(h, payload)
	if err != nil {
		c.abortLocked(protoErr("%v", err))
		return
	}
	lo, hi := c.versions()
	v, ok := negotiate(lo, hi, m.minVer, m.maxVer)
	if !ok {
		// The acceptor's hello went with the handshake: the dialer learns
		// the same from it.
		c.abortLocked(&abortError{err: fmt.Errorf("%w: we speak [%d, %d], the peer [%d, %d]", ErrVersion, lo, hi, m.minVer, m.maxVer)})
		return
	}
	c.version = v
	if !c.dialer {
		// Grant no more than the dialer's rings hold.
		if m.ringCap < uint32(shm.MinRingCapacity) || m.ringCap > uint32(shm.MaxRingCapacity) {
			c.abortLocked(protoErr("hello ring capacity %d", m.ringCap))
			return
		}
		fit := int(m.ringCap)/recordSize(c.bufSize) - 2
		if fit < minWindow {
			c.abortLocked(protoErr("the dialer's rings of %d bytes hold too few of our %d-byte messages", m.ringCap, c.bufSize))
			return
		}
		c.window = uint32(min(int(c.window), fit))
	} else if m.ringCap != 0 {
		c.abortLocked(protoErr("hello from the acceptor with ring capacity %d", m.ringCap))
		return
	}
	c.peerWindow = m.window
	c.peerBufSize = int(m.bufSize)
	c.peerRead = m.flags&helloRead != 0
	c.peerMaxXfer = int(m.maxTransfer)
	c.peerBell, c.peerBellKey = m.bellAddr, m.bellKey
	c.maxPayload = min(c.bufSize, c.peerBufSize) - headerSize
	c.helloDone = true
}

// sendHelloLocked sends our hello; it needs no credit (the peer posts its
// receives before it reads ours, and a hello fits the smallest buffer).
func (c *Conn) sendHelloLocked() error {
	lo, hi := c.versions()
	m := hello{minVer: lo, maxVer: hi, window: c.window, bufSize: uint32(c.bufSize), maxTransfer: uint32(c.cfg.MaxTransfer)}
	if c.offerRead {
		m.flags |= helloRead
	}
	if c.dialer {
		m.ringCap = uint32(c.dev.key.ringCap)
	}
	var p [helloSize]byte
	m.put(p[:])
	var h header
	h.SetType(msgHello)
	h.SetAddr(uint64(c.bellMR.Addr))
	h.SetRKey(c.bellMR.RKey)
	done := c.helloDone
	c.helloDone = true // lets sendLocked go; no credit is checked
	err := c.sendLocked(&h, p[:])
	c.helloDone = done
	return err
}

func (c *Conn) versions() (uint16, uint16) {
	if c.cfg.versions != [2]uint16{} {
		return c.cfg.versions[0], c.cfg.versions[1]
	}
	return protoMinVersion, protoMaxVersion
}

// abortLocked aborts the connection because of err: it tells the peer
// (best effort: an abort message), fails every call, and releases the
// connection.
func (c *Conn) abortLocked(err error) {
	if c.err != nil && !c.errDrain {
		return
	}
	c.err, c.errDrain = err, false
	c.stats.count(cAborts, 1)
	if c.helloDone && c.canSendLocked(classCredit) {
		reason := err.Error()
		if len(reason) > maxReason {
			reason = reason[:maxReason]
		}
		var h header
		h.SetType(msgAbort)
		if c.sendLocked(&h, []byte(reason)) == nil {
			c.abortSent = true
		}
	}
	c.wakeLocked()
	c.teardownLocked()
}

// resetLocked records that the peer reset the connection: received data
// is still delivered, then err.
func (c *Conn) resetLocked(err error) {
	if c.err != nil {
		return
	}
	c.err, c.errDrain = err, true
	c.stats.count(cResets, 1)
	c.wakeLocked()
	c.teardownLocked()
}

// qpFailedLocked records that the queue pair failed: the peer closed it
// or died, or a work request failed.
func (c *Conn) qpFailedLocked(reason error) {
	if c.qpDead {
		return
	}
	c.qpDead = true
	if c.err == nil && !c.closed {
		var ce *nic.CompletionError
		if errors.As(reason, &ce) && ce.Status == nic.StatusRemoteAccess {
			c.abortLocked(descriptorErr(reason))
			return
		}
		if !c.peerFin {
			c.resetLocked(&resetError{reason: goneReason(reason)})
			return
		}
		// After a fin, reads end with EOF; writes fail.
		c.err, c.errDrain = &resetError{reason: "peer closed"}, true
	}
	c.wakeLocked()
	if c.closed || c.err != nil {
		c.teardownLocked()
	}
}

// abortGrace bounds how long an aborting side waits for the peer to take
// its abort and hang up first.
const abortGrace = 500 * time.Millisecond

// awaitHangup waits, for at most grace, until the peer hangs up. nic: a
// hang-up drains the peer's receive ring without the lock that a waiter
// in CompletionQueue.Wait skips too (a data race); if the peer is asleep
// there with our abort in its ring when we hang up, the race happens.
// The peer takes the abort, resets and hangs up itself; then we go.
func (c *Conn) awaitHangup(grace time.Duration) {
	end := time.Now().Add(grace)
	for nap := time.Microsecond; c.qp.State() != nic.QPError && time.Now().Before(end); nap = min(2*nap, time.Millisecond) {
		time.Sleep(nap)
	}
}

// teardownLocked starts releasing the connection in the background.
func (c *Conn) teardownLocked() {
	if c.tearing {
		return
	}
	c.tearing = true
	go c.teardown()
}

// linger delivers what a closed connection wrote: it sends the queued
// messages and waits until the peer consumed all of them, or the peer
// went, or Config.Linger passed; then it tears the connection down.
func (c *Conn) linger() {
	dl := makeDeadline()
	dl.set(time.Now().Add(c.cfg.Linger))
	c.mu.Lock()
	for !c.qpDead && c.err == nil && !c.torn {
		c.pumpLocked()
		if len(c.ctlq) == 0 && int32(c.peerAck-c.lastNonCredit) >= 0 && len(c.txq) == 0 {
			break
		}
		gen := c.rounds
		c.mu.Unlock()
		err := c.progressMode(gen, &dl, false, true)
		c.mu.Lock()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.abortLocked(&abortError{err: fmt.Errorf("peer consumed nothing for %v after close", c.cfg.Linger)})
			break
		}
	}
	c.mu.Unlock()
	dl.set(time.Time{})
	c.teardown()
	lingerEnd()
}

// teardown releases the connection's registrations, then its queue pair,
// then its hold on the device. It waits for the calls in flight to
// return. Idempotent.
func (c *Conn) teardown() {
	c.tearOnce.Do(func() {
		c.rmu.Lock()
		c.wmu.Lock()
		c.mu.Lock()
		c.tearing = true
		// Data lent out of the ring (WriteTo) is read until its
		// destination's Write returns: the ring must stay until then.
		for c.lending {
			ch := make(chan struct{})
			c.lendWait = ch
			c.mu.Unlock()
			<-ch
			c.mu.Lock()
		}
		// What a Read may still deliver leaves the ring, which goes with
		// the queue pair.
		c.spillLocked()
		c.torn = true
		d := c.dev
		var keep, drop [][]byte
		dereg := func(mr **nic.MemoryRegion) {
			if *mr != nil {
				d.nic.Deregister(*mr)
				*mr = nil
			}
		}
		for _, x := range c.txq {
			dereg(&x.mr)
			if x.temp != nil {
				keep = append(keep, x.temp)
			}
		}
		c.txq = nil
		if x := c.wtx; x != nil {
			dereg(&x.mr)
			if x.temp != nil {
				keep = append(keep, x.temp)
			}
			c.wtx = nil
		}
		if c.rd.active {
			dereg(&c.rd.mr)
			if !c.rd.read && !c.rd.direct && c.stage != nil {
				// The peer may still be writing it: never reuse it.
				drop = append(drop, c.stage)
				c.stage = nil
			}
			c.rd = recvOp{}
		}
		if c.stage != nil {
			keep = append(keep, c.stage)
			c.stage, c.staged = nil, nil
		}
		// The connection's cached registrations go with it — the
		// application buffers it pinned for zero-copy sends and direct
		// reads (docs/origins.md: a connection's cached buffers are
		// released before it closes).
		d.nic.Flush(c.owner)
		c.wakeLocked()
		abortSent := c.abortSent
		c.mu.Unlock()
		c.wmu.Unlock()
		c.rmu.Unlock()
		if abortSent {
			c.awaitHangup(abortGrace)
		}
		c.qp.Close()
		c.cq.Close()
		for _, b := range keep {
			d.putTemp(b)
		}
		for _, b := range drop {
			d.dropTemp(b)
		}
		d.release()
		c.stats.retire()
		close(c.tornDown)
	})
}

// ensurePumpLocked makes sure queued control messages go out when no call
// of the application is there to drive the connection: a goroutine
// drives it until the queue is empty.
func (c *Conn) ensurePumpLocked() {
	if len(c.ctlq) == 0 || c.pumping || c.tearing || c.err != nil || c.qpDead {
		return
	}
	c.pumping = true
	go func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for len(c.ctlq) > 0 && !c.tearing && c.err == nil && !c.qpDead {
			gen := c.rounds
			c.mu.Unlock()
			c.progressMode(gen, nil, false, true)
			c.mu.Lock()
		}
		c.pumping = false
	}()
}
