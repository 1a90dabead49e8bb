package sockets

import (
	"fmt"
	"time"

	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// Dispatch of what the peer sends and the nic completes: messages taken
// from the ring, parsed and handed to a handler per message type
// (on…Locked), and completions of our own RDMA work.

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
	for !c.torn && !c.ringEnd {
		data, start, ok := c.nextMsgLocked()
		if !ok {
			break
		}
		got = true
		c.onRecvLocked(data, start)
	}
	c.releaseLocked()
	return got
}

// nextMsgLocked takes the next message from the ring, if one has come:
// its bytes (in the ring, the peer's to scribble on) and its ring
// position. A ring that failed or ended ends here (ringEndLocked). The
// caller is the ring's reader (polling).
func (c *Conn) nextMsgLocked() (data []byte, start uint64, ok bool) {
	data, end, ok, err := c.qp.RecvInPlace()
	if err != nil {
		c.upgradeLocked() // a fast Read: the end is the general path's
		c.ringEndLocked(err)
		return nil, 0, false
	}
	if !ok {
		return nil, 0, false
	}
	start = c.inPos
	c.inPos = end
	u := uint32(1)
	if len(data) > c.maxPayload+shortHeaderSize { // else one unit: msgUnits
		u = c.msgUnits(data)
	}
	c.lastUnits = u
	c.taken += uint64(u)
	c.interesting = true
	return data, start, true
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
			c.sendFailedLocked(comp.Err())
		}
	default:
		c.interesting = true
		c.sendFailedLocked(comp.Err())
	}
}

// onRecvLocked handles a message the peer sent, msg, where it lies in the
// ring from position start.
func (c *Conn) onRecvLocked(msg []byte, start uint64) {
	if c.err != nil && !c.errDrain {
		return // aborted: nothing more is read
	}
	if c.tooLong(msg) {
		c.abortLocked(protoErr("message of %d bytes, larger than the %d bytes of its type", len(msg), c.msgLimit(msg)))
		return
	}
	if len(msg) > 0 && msgType(msg[offType]) == msgShort && c.helloDone {
		c.onShortLocked(msg, start)
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

// onShortLocked is onRecvLocked of a short data message (shortFields).
func (c *Conn) onShortLocked(msg []byte, start uint64) {
	ack, payload, err := shortFields(msg)
	switch {
	case err != nil:
		c.abortLocked(protoErr("malformed message: %v", err))
		return
	case c.version < shortVersion:
		c.abortLocked(protoErr("short data in version %d", c.version))
		return
	}
	c.stats.count(cMsgsReceived, 1)
	if c.creditLocked(msgShort, ack) {
		c.onDataLocked(payload, start)
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
	c.maxData = c.maxPayload
	if v >= unitsVersion {
		c.maxData = 2 * c.maxPayload
	}
	c.helloDone = true
}

func (c *Conn) versions() (uint16, uint16) {
	if c.cfg.versions != [2]uint16{} {
		return c.cfg.versions[0], c.cfg.versions[1]
	}
	return protoMinVersion, protoMaxVersion
}

// onRTSLocked queues a peer's rts.
func (c *Conn) onRTSLocked(start uint64, h *header, payload []byte) {
	switch {
	case c.closed:
		c.abortLocked(&abortError{err: errLateData})
		return
	case c.peerFin:
		c.abortLocked(protoErr("rts after fin"))
		return
	case h.ID() != c.nextRx:
		c.abortLocked(protoErr("rts of transfer %d, expected %d", h.ID(), c.nextRx))
		return
	case h.Flags()&flagSplit != 0 && c.version < 3:
		c.abortLocked(protoErr("split rts in version %d", c.version))
		return
	case h.Flags()&flagRead != 0 && !c.offerRead:
		c.abortLocked(protoErr("read rendezvous towards a side that does not RDMA Read"))
		return
	case int(h.Size()) > c.cfg.MaxTransfer:
		c.abortLocked(protoErr("rts of %d bytes, more than our %d", h.Size(), c.cfg.MaxTransfer))
		return
	}
	c.nextRx++
	e := rxEntry{
		kind: msgRTS, data: payload,
		id: h.ID(), size: h.Size(), read: h.Flags()&flagRead != 0, split: h.Flags()&flagSplit != 0,
		addr: h.Addr(), rkey: h.RKey(),
	}
	c.holdLocked(&e, start)
	c.pushRxLocked(e)
}

// onCTSLocked records the peer's sink for our write rendezvous.
func (c *Conn) onCTSLocked(h *header) {
	x := c.wtx
	if h.Flags()&flagSplit != 0 {
		switch {
		case c.version < 3 || x == nil || !x.split || x.id != h.ID():
			c.abortLocked(protoErr("split cts for transfer %d, which is not a split transfer in progress", h.ID()))
			return
		case x.tailAsked:
			c.abortLocked(protoErr("second split cts for transfer %d", h.ID()))
			return
		case h.Offset() == 0 || uint64(h.Offset())+uint64(h.Size()) != uint64(x.size):
			c.abortLocked(protoErr("split cts [%d, +%d) of a %d-byte transfer", h.Offset(), h.Size(), x.size))
			return
		}
		x.tailAsked, x.cts = true, true
		x.ctsOff, x.ctsLen, x.ctsAddr, x.ctsKey = h.Offset(), h.Size(), h.Addr(), h.RKey()
		return
	}
	if x != nil && x.read {
		c.abortLocked(protoErr("cts without flagSplit for read transfer %d", h.ID()))
		return
	}
	if x == nil || x.id != h.ID() {
		if c.lastCancelled != 0 && h.ID() == c.lastCancelled-1 {
			return // it crossed our cancel
		}
		c.abortLocked(protoErr("cts for transfer %d, which is not in progress", h.ID()))
		return
	}
	if x.cts {
		c.abortLocked(protoErr("cts for transfer %d while a cts waits to be served", h.ID()))
		return
	}
	// The next chunk starts where the last one written ends. Our RDMA
	// Write of it may not have completed here yet: the peer asks for the
	// next one once our done came, which followed the Write on the queue
	// pair, so its data has landed.
	next := x.off
	if x.writing {
		next = x.wOff + x.wLen
	}
	if h.Offset() != next || h.Size() > x.size-next {
		c.abortLocked(protoErr("cts chunk [%d, +%d) of transfer %d: %d of %d bytes written", h.Offset(), h.Size(), h.ID(), next, x.size))
		return
	}
	x.cts = true
	x.ctsOff, x.ctsLen, x.ctsAddr, x.ctsKey = h.Offset(), h.Size(), h.Addr(), h.RKey()
}

// onDoneLocked completes a chunk of our write-rendezvous receive, or the
// oldest of our read-rendezvous sends.
func (c *Conn) onDoneLocked(h *header) {
	op := &c.rd
	if h.Flags()&flagSplit != 0 {
		if c.version < 3 || !op.active || !op.split || op.tailDone || h.ID() != op.id || h.Offset() != op.tailOff || h.Size() != op.tailLen {
			c.abortLocked(protoErr("split done of transfer %d [%d, +%d), expected %d [%d, +%d)", h.ID(), h.Offset(), h.Size(), op.id, op.tailOff, op.tailLen))
			return
		}
		op.tailDone = true
		op.done = op.readDone
		return
	}
	sink := op.active && !op.read && !op.done && !op.cancelled
	switch {
	case c.version >= 4 && h.Flags()&flagChunk != 0:
		if !sink {
			c.abortLocked(protoErr("chunk done of transfer %d, no sink of ours outstanding", h.ID()))
			return
		}
		c.onChunkDoneLocked(h)
		return
	case h.Flags()&flagChunk != 0:
		c.abortLocked(protoErr("done with flags %#x in version %d", h.Flags(), c.version))
		return
	case sink && c.version < 4:
		// Before flagChunk: a done while our sink is outstanding is its.
		if h.Flags() != 0 {
			c.abortLocked(protoErr("done of a write rendezvous with flags %#x", h.Flags()))
			return
		}
		c.onChunkDoneLocked(h)
		return
	}
	if len(c.txq) == 0 {
		c.abortLocked(protoErr("done of transfer %d, none outstanding", h.ID()))
		return
	}
	x := c.txq[0]
	if h.ID() != x.id || h.Size() != x.size || h.Offset() != 0 {
		c.abortLocked(protoErr("out-of-order done: transfer %d of %d bytes, expected %d of %d", h.ID(), h.Size(), x.id, x.size))
		return
	}
	if h.Flags() != 0 && c.version < 2 {
		c.abortLocked(protoErr("done with flags %#x in version %d", h.Flags(), c.version))
		return
	}
	if x.split && x.tailAsked && !x.tailSent {
		c.abortLocked(protoErr("done of split transfer %d before its tail was written", x.id))
		return
	}
	c.peerStages = h.Flags()&flagStaged != 0
	if x.split && !x.tailAsked {
		c.noSplitUntil = time.Now().Add(splitRetry)
	}
	c.txq[0] = nil
	c.txq = c.txq[1:]
	if len(c.txq) == 0 {
		c.txq = nil
	}
	x.done = true
	if x.temp != nil {
		c.copyInFlight -= int(x.size)
	}
	now := time.Now()
	if x.copyD > 0 {
		// The reader's time on this piece: from when it could start it
		// (the rts left, or it finished the one before) to now.
		start := x.sentAt
		if c.lastDone.After(start) {
			start = c.lastDone
		}
		c.dev.pieces.record(x.nt, int(x.size), max(x.copyD, now.Sub(start)))
	}
	c.lastDone = now
	if x.learnBytes > 0 {
		c.learn.record(x.learnZC, now.Sub(x.learnStart), x.learnBytes)
	}
	c.releaseSourceLocked(x)
	c.stats.count(cBytesReadRdv, uint64(x.size))
}

// onChunkDoneLocked completes the chunk of our write-rendezvous receive
// that the sender says it wrote.
func (c *Conn) onChunkDoneLocked(h *header) {
	op := &c.rd
	if h.ID() != op.id || h.Offset() != op.off || h.Size() != op.n {
		c.abortLocked(protoErr("done of transfer %d [%d, +%d), expected %d [%d, +%d)", h.ID(), h.Offset(), h.Size(), op.id, op.off, op.n))
		return
	}
	op.done = true
}

// onCancelLocked ends a write rendezvous the peer gave up.
func (c *Conn) onCancelLocked(h *header) {
	var e *rxEntry
	for i := c.rxHead; i < len(c.rx); i++ {
		if c.rx[i].kind == msgRTS && !c.rx[i].read && c.rx[i].id == h.ID() {
			e = &c.rx[i]
			break
		}
	}
	if e == nil {
		c.abortLocked(protoErr("cancel of transfer %d, which is not in progress", h.ID()))
		return
	}
	if h.Offset() != e.off {
		c.abortLocked(protoErr("cancel of transfer %d at %d, %d bytes arrived", h.ID(), h.Offset(), e.off))
		return
	}
	if op := &c.rd; op.active && op.id == e.id && !op.read {
		if op.done {
			c.abortLocked(protoErr("cancel of transfer %d after its done", h.ID()))
			return
		}
		op.cancelled = true
	}
	e.size = e.off
}

// onRDMALocked completes one of our RDMA operations.
func (c *Conn) onRDMALocked(comp *nic.Completion) {
	var err error
	if comp.Status != nic.StatusSuccess {
		err = comp.Err()
		if comp.Status == nic.StatusRemoteAccess {
			c.abortLocked(descriptorErr(err))
			err = c.err
		} else {
			if comp.ID&wrKind == wrRead {
				c.qpFailedLocked(err) // the stream we receive broke
			} else {
				c.sendFailedLocked(err) // ours: the peer's data still comes
			}
			if c.err != nil {
				err = c.err
			}
		}
	}
	if comp.ID&wrKind == wrRead {
		if op := &c.rd; op.active && op.read {
			if op.split && err == nil {
				op.readDone = true
				op.done = op.tailDone
			} else {
				op.done, op.err = true, err
			}
		}
		return
	}
	if x := c.wtx; x != nil && x.writing {
		x.writing = false
		if err != nil {
			x.werr = err
			return
		}
		if x.read {
			return // the tail of a split transfer: counted when posted
		}
		x.off = x.wOff + x.wLen
		c.stats.count(cBytesWriteRdv, uint64(x.wLen))
	}
}
