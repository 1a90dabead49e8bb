package sockets

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/gopool"
	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/nic"
)

// The send path: control messages written into the ring to the peer and
// their queue, small writes' data messages, and large writes' rendezvous
// from the sender's side — the source (copied or registered in place), the
// read and write rendezvous, and split transfers' tails.

// sendLocked sends one control message built from h and payload; the
// caller checked canSendLocked. It fills in the ack.
func (c *Conn) sendLocked(h *header, payload []byte) error {
	var ack uint32
	if c.sendOnly {
		// A fast Write, which holds no receive side to release ring
		// space with: the ack published at the last release.
		ack = c.ackPub.load()
	} else {
		// The ack below gives the peer credit for what we are done with:
		// their ring space must be free first.
		c.releaseLocked()
		ack = c.ackableLocked()
	}
	h.SetAck(ack)
	hl := headerSize
	if h.Type() == msgShort {
		hl = shortHeaderSize // its length is the record's
	} else {
		h.SetLen(uint32(len(payload)))
	}
	n := hl + len(payload)
	// Straight into the ring to the peer: one copy, no completion. The
	// credits guarantee room (the ring holds a window of our largest
	// messages); a peer that lies about what it released runs out of it.
	buf, err := c.qp.ReserveSend(n)
	if err != nil {
		if c.sendOnly {
			return errNeedBoth // the general path fails the connection
		}
		if errors.Is(err, nic.ErrRingFull) {
			c.abortLocked(protoErr("no room in the ring with %d credits left: the peer holds what it acknowledged", c.creditsLocked()))
			return c.writableLocked()
		}
		c.sendFailedLocked(err)
		return c.writableLocked()
	}
	if hl == shortHeaderSize {
		binary.LittleEndian.PutUint64(buf, uint64(msgShort)|uint64(ack)<<32) // flags and reserved 0
	} else {
		copy(buf, h[:])
	}
	// The payload may be application memory that faults (fault.go): the
	// reservation is given back if it does (abandonSendLocked).
	c.reserved = true
	mem.CopyShared(buf[hl:], payload)
	c.reserved = false
	// Published before the commit (pub32): the peer's answer to this
	// message may reach the receive side at once.
	units := c.unitsOf(h.Type(), len(payload))
	sent, ackSent := c.sent.load()+units, c.ackSent.load()
	c.sent.store(sent)
	c.ackSent.store(ack)
	if err := c.qp.CommitSend(n); err != nil {
		c.sent.store(sent - units)
		c.ackSent.store(ackSent)
		if c.sendOnly {
			return errNeedBoth
		}
		c.sendFailedLocked(err)
		return c.writableLocked()
	}
	if c.replyLook {
		c.replyDue.Store(true) // a locked instruction: only where it is read
	}
	if h.Type() != msgCredit {
		c.lastNonCredit = sent
	} else {
		c.stats.count(cCreditMsgs, 1)
	}
	c.stats.count(cMsgsSent, 1)
	return nil
}

// errNeedBoth: a fast Write met what only the general path handles (a
// failure of the queue pair, a peer that broke the credit rules); it
// goes on there, with both halves of Conn.mu.
var errNeedBoth = errors.New("needs the general path")

// queueCtlLocked queues a control message; pumpLocked sends it when a
// credit allows, in order.
func (c *Conn) queueCtlLocked(m ctlMsg) {
	c.ctlq = append(c.ctlq, m)
	c.pumpLocked()
}

// pumpLocked sends queued control messages and an explicit credit
// message when one is due.
func (c *Conn) pumpLocked() {
	if len(c.ctlq) == 0 && c.consumed == c.ackSent.load() {
		// Nothing queued, and nothing to acknowledge: what an ack may
		// carry (ackableLocked) is at most what was consumed, and acks
		// only grow. The common case on every Read and Write.
		return
	}
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
	if c.creditDueLocked() && c.canSendLocked(classCredit) {
		var h header
		h.SetType(msgCredit)
		c.sendLocked(&h, nil)
	}
}

// creditDueLocked tells whether a credit message is due. It only reads:
// a fast Read asks it under the receive half alone (pumpReadLocked).
func (c *Conn) creditDueLocked() bool {
	ackSent := c.ackSent.load()
	if c.consumed == ackSent {
		return false
	}
	// Return credit at half the window; or, for a consumed message other
	// than a credit, when the peer is out of credit for control messages
	// or closing, or we are closing (the closer waits for our ack).
	unacked := c.ackableLocked() - ackSent
	starved := c.window-(c.received-ackSent) < uint32(classControl)
	owed := int32(c.owedAt-ackSent) > 0
	due := unacked > 0 && (unacked >= c.window/2 || (owed && (starved || c.peerFin || c.closed)))
	// The peer's credit messages can eat the credits it keeps for control
	// messages: when it is starved and an ack would give some back, and
	// we have credits to spare (so two starved sides never trade credit
	// messages), acknowledge them. Without this, a peer that spent its
	// last credits on credit messages could never send the done our
	// zero-copy write waits for (an echo hung so).
	if !due && unacked > 0 && starved && c.creditsLocked() > uint32(classControl) {
		due = true
	}
	return due
}

// pumpReadLocked is pumpLocked for a Read, which may hold the receive
// half alone: it takes the send half only when something is to be sent.
func (c *Conn) pumpReadLocked() {
	if len(c.ctlq) > 0 || c.creditDueLocked() {
		c.upgradeLocked()
		c.pumpLocked()
	}
}

// ensurePumpLocked makes sure queued control messages go out when no call
// of the application is there to drive the connection: a goroutine
// drives it until the queue is empty.
func (c *Conn) ensurePumpLocked() {
	if len(c.ctlq) == 0 || c.pumping || c.tearing || c.err != nil || c.qpDead {
		return
	}
	c.pumping = true
	gopool.Go(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for len(c.ctlq) > 0 && !c.tearing && c.err == nil && !c.qpDead {
			c.progressLocked(c.rounds, nil, false, false)
		}
		c.pumping = false
	})
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

// sendDataLocked sends the first bytes of b in one data message: of two
// credits' payload when there is that much and the credits allow it
// (unitsOf), else of one.
func (c *Conn) sendDataLocked(b []byte) (int, error) {
	// A fast Write checked the connection writable and its credits for
	// all of its messages (fastWritableLocked), and nothing else sends
	// while it holds the send half: it does not wait.
	if !c.sendOnly {
		if err := c.waitSendLocked(); err != nil {
			return 0, err
		}
	}
	m := min(len(b), c.maxPayload)
	if len(b) > m && c.maxData > m && c.creditsLocked() > uint32(classData) {
		m = min(len(b), c.maxData)
	}
	t := msgData
	if c.version >= shortVersion {
		t = msgShort
	}
	var h header
	h.SetType(t)
	if err := c.sendLocked(&h, b[:m]); err != nil {
		return 0, err
	}
	c.stats.count(cBytesEager, uint64(m))
	hook(stepDataSent)
	return m, nil
}

// chooseSourceLocked decides how the source of a rendezvous is provided
// (chooseSource, policy.go): copied into temporary memory (true) or
// registered in place, and counts what decided it.
func (c *Conn) chooseSourceLocked(body []byte, split bool) bool {
	f := sourceFacts{
		n: len(body), mode: c.cfg.ZeroCopy, copyThreshold: c.cfg.CopyThreshold,
		zeroCopyMax: c.cfg.ZeroCopyMax, maxCopyInFlight: c.cfg.MaxCopyInFlight,
		copyInFlight: c.copyInFlight, bigWrite: c.bigWrite, peerRead: c.peerRead,
		deadline: c.wdl.isSet.Load(), shared: c.sharedSource(body), split: split,
		peerStages: c.peerStages, reused: c.reused, learnedZC: c.lw && c.lwZC,
		cached: func() bool { return c.dev.nic.Cached(body) },
	}
	copied, why := chooseSource(&f)
	switch why {
	case whyBigWrite:
		c.stats.count(cFallbacks, 1) // lowmem.go
	case whyShared:
		c.stats.count(cZeroShared, 1)
	case whyPeerStages:
		c.stats.count(cCopyPeerStages, 1)
	case whyNewBuffer:
		c.stats.count(cCopyNewBuffer, 1)
	}
	return copied
}

// prepareSourceLocked registers the source of a rendezvous: body copied
// into temporary memory, or body itself. When the chosen way fails for
// lack of resources the other is tried; when both fail the error matches
// syscall.ENOBUFS. It may release mu while it copies.
func (c *Conn) prepareSourceLocked(body []byte, copyMode, read bool) (*txfer, error) {
	x := &txfer{read: read, size: uint32(len(body))}
	access := nic.Access(0)
	if read {
		access = nic.AccessRemoteRead
	}
	try := func(cp bool) error {
		if !cp {
			mr, err := c.dev.register(c.owner, body, access)
			if err != nil {
				return err
			}
			c.stats.count(cRegisters, 1)
			x.src, x.temp, x.mr = body, nil, mr
			return nil
		}
		t, err := c.dev.getTemp(len(body))
		if err != nil {
			return err
		}
		// Temporary memory is the device's, reused by every connection.
		// Short of locked memory, a shorter piece (lowmem.go).
		mr, n, err := c.dev.registerPrefix(nic.NoOwner, t[:len(body)], access)
		if err != nil {
			c.dev.putTemp(t)
			return err
		}
		body, x.size = body[:n], uint32(n)
		c.stats.count(cRegisters, 1)
		c.mu.Unlock()
		x.nt, x.copyD, err = c.dev.pieces.copy(t[:len(body)], body)
		c.mu.Lock()
		if err != nil {
			// The application's buffer faulted: nothing was sent.
			c.dev.nic.Deregister(mr)
			c.dev.putTemp(t)
			return err
		}
		if x.nt {
			c.stats.count(cBytesCopiedNT, uint64(len(body)))
		}
		x.src, x.temp, x.mr = t[:len(body)], t, mr
		return nil
	}
	err := try(copyMode)
	if err != nil && errors.Is(err, syscall.ENOBUFS) {
		c.stats.count(cFallbacks, 1)
		if !copyMode {
			// Copied in pieces, as a chosen copy is (lowmem.go).
			body = body[:min(len(body), copyChunk(len(body), c.cfg.CopyChunk, c.cfg.MaxCopyInFlight, c.cfg.WaitedChunk, c.waitedWrite))]
			x.size = uint32(len(body))
		}
		err = try(!copyMode)
	}
	if err != nil {
		return nil, err
	}
	if x.temp != nil {
		c.stats.count(cCopyChosen, 1)
		c.stats.count(cBytesCopied, uint64(len(body)))
	} else {
		c.stats.count(cZeroChosen, 1)
		c.stats.count(cBytesZeroCopy, uint64(len(body)))
	}
	return x, nil
}

// releaseSourceLocked deregisters a rendezvous source and gives back its
// temporary memory.
func (c *Conn) releaseSourceLocked(x *txfer) {
	if x.mr != nil && !c.torn {
		c.dev.nic.Deregister(x.mr)
	}
	x.mr = nil
	if x.temp != nil && !c.torn {
		c.dev.putTemp(x.temp)
	}
	x.temp = nil
}

// copyChunk is the piece of a copied write with rest bytes left to send:
// chunk, or for a write far larger than the caches, 2 MiB (at most half of
// what may be in flight). Pieces of 1 MiB or more take Go's non-temporal
// copy on both sides, which saves reading a cold destination in before
// writing it (docs/performance.md, "Large pieces"). A smaller write keeps
// its pieces in cache for the reader.
//
// A write that found none of our copies in flight has a reader waiting
// for it (a request, or its answer): its pieces are at most waitedChunk
// (Config.WaitedChunk; 0 or less: none), so that the reader copies one
// out while we copy the next in, instead of waiting for all of a large
// piece. A stream keeps copies in flight, and its large pieces.
func copyChunk(rest, chunk, inFlight, waitedChunk int, waited bool) int {
	const large, piece = 8 << 20, 2 << 20
	if rest >= large && chunk < piece && inFlight >= 2*piece {
		return piece
	}
	if waited && waitedChunk > 0 {
		return min(chunk, waitedChunk)
	}
	return chunk
}

// sendLargeLocked sends the first part of b by rendezvous: an rts with
// the first maxPayload bytes inline, then up to MaxTransfer bytes by the
// read rendezvous (the peer RDMA-Reads our source) or the write
// rendezvous (we RDMA-Write into the sinks the peer gives us).
func (c *Conn) sendLargeLocked(b []byte) (int, error) {
	if time.Now().Before(c.eagerUntil) {
		return c.sendEagerLocked(b[:min(len(b), c.cfg.CopyChunk)]) // lowmem.go
	}
	inline := c.maxPayload
	body := b[inline:]
	read := c.peerRead
	size := min(len(body), c.cfg.MaxTransfer, c.peerMaxXfer)
	// The choice reads what the peer said last (its dones): take what has
	// arrived. A writer whose copies return at once may not poll
	// otherwise for as long as it has credits.
	c.pollNowLocked()
	split := read && c.offerSplitLocked(body[:size])
	copyMode := c.chooseSourceLocked(body[:size], split)
	if copyMode {
		size = min(size, copyChunk(len(body), c.cfg.CopyChunk, c.cfg.MaxCopyInFlight, c.cfg.WaitedChunk, c.waitedWrite))
		if err := c.awaitCopyRoomLocked(read, size); err != nil {
			return 0, err
		}
	}
	if err := c.waitSendLocked(); err != nil {
		return 0, err
	}
	x, err := c.sourceLocked(body[:size], copyMode, read)
	if errors.Is(err, syscall.ENOBUFS) {
		return c.noBufsLocked(b) // lowmem.go
	}
	if err != nil {
		return 0, err
	}
	// The copy released mu: look again.
	if err := c.waitSendLocked(); err != nil {
		c.releaseSourceLocked(x)
		return 0, err
	}
	x.id = c.nextTx
	c.nextTx++
	x.split = split && x.temp == nil // not after a fallback to a copy
	switch {
	case !c.lw:
	case (x.temp == nil) != c.lwZC:
		// The facts overruled the learner's choice, or the way chosen
		// fell back to the other: this write says nothing of the way it
		// asked for.
		c.lwMixed = true
	case !c.lwMixed && inline+int(x.size) == len(b):
		// The measured write's last piece: its done ends the sample.
		x.learnStart, x.learnBytes, x.learnZC = c.lwStart, c.lwBytes, c.lwZC
	}
	h := c.rtsHeaderLocked(x, read)
	hook(stepSourceReady)
	if err := c.sendGuardedLocked(&h, b[:inline], "write"); err != nil {
		c.releaseSourceLocked(x)
		c.nextTx-- // no rts went out
		return 0, err
	}
	if x.copyD > 0 {
		x.sentAt = time.Now()
	}
	c.stats.count(cBytesInline, uint64(inline))
	c.stats.count(cRendezvous, 1)
	hook(stepRTSSent)
	if read {
		return c.readRendezvousLocked(x, inline)
	}
	return c.writeRendezvousLocked(x, inline)
}

// awaitCopyRoomLocked waits until a copied piece of size bytes fits in
// what the peer may have not taken yet (Config.MaxCopyInFlight).
func (c *Conn) awaitCopyRoomLocked(read bool, size int) error {
	for read && c.copyInFlight > 0 && c.copyInFlight+size > c.cfg.MaxCopyInFlight {
		if err := c.writableLocked(); err != nil {
			return err
		}
		if c.wdl.expired.Load() {
			return os.ErrDeadlineExceeded
		}
		if err := c.waitLocked(&c.wdl, true); err != nil {
			return err
		}
	}
	return nil
}

// sourceLocked is prepareSourceLocked that, when our own copies in flight
// hold the resources it lacks (ENOBUFS), waits for the peer to take them
// and tries once more.
func (c *Conn) sourceLocked(body []byte, copyMode, read bool) (*txfer, error) {
	x, err := c.prepareSourceLocked(body, copyMode, read)
	if !errors.Is(err, syscall.ENOBUFS) || c.copyInFlight == 0 {
		return x, err
	}
	for c.copyInFlight > 0 {
		if werr := c.writableLocked(); werr != nil {
			return nil, werr
		}
		if c.wdl.expired.Load() {
			return nil, os.ErrDeadlineExceeded
		}
		c.waitLocked(&c.wdl, true)
	}
	return c.prepareSourceLocked(body, copyMode, read)
}

// rtsHeaderLocked builds the rts of x: its id and size, and for a read
// rendezvous its source's descriptor and whether it is offered split.
func (c *Conn) rtsHeaderLocked(x *txfer, read bool) header {
	var h header
	h.SetType(msgRTS)
	h.SetID(x.id)
	h.SetSize(x.size)
	if read {
		h.SetFlags(flagRead)
		if x.split {
			h.SetFlags(flagRead | flagSplit)
			c.stats.count(cZeroSplit, 1)
		}
		h.SetAddr(uint64(x.mr.Addr))
		h.SetRKey(x.mr.RKey)
	}
	return h
}

// readRendezvousLocked waits, for a zero-copy source, until the peer has
// read it; a copied source needs no wait.
func (c *Conn) readRendezvousLocked(x *txfer, inline int) (int, error) {
	c.txq = append(c.txq, x)
	if x.temp != nil {
		c.copyInFlight += int(x.size)
		return inline + int(x.size), nil
	}
	if x.split {
		// The peer may ask for the tail with a cts (onCTSLocked).
		c.wtx = x
		defer func() {
			if c.wtx == x {
				c.wtx = nil
			}
		}()
	}
	for !x.done {
		if x.cts && !x.writing && c.err == nil && !c.qpDead && !c.closed {
			// The tail, while the peer reads the head.
			if c.serveCTSLocked(x, flagSplit, stepBeforeTail, stepNone) {
				c.stats.count(cBytesSplitTail, uint64(x.wLen))
				x.tailSent = true
			}
			continue
		}
		var err error
		switch {
		case c.err != nil:
			err = c.err
		case c.closed:
			err = net.ErrClosed
		case c.qpDead:
			err = c.failureLocked()
		case c.wdl.expired.Load():
			// The peer may be reading our buffer: the only way to give
			// it back now is to revoke it, which ends the connection.
			err = os.ErrDeadlineExceeded
			c.abortLocked(&abortError{err: errors.New("write deadline passed during a zero-copy transfer")})
		}
		if err != nil {
			err = c.blameSourceLocked(x, err)
			c.abandonTxLocked(x)
			return inline, err
		}
		c.waitLocked(&c.wdl, true)
	}
	return inline + int(x.size), nil
}

// serveCTSLocked serves the cts x holds: an RDMA Write of that chunk of
// x's source into the peer's sink, then done with flags — posted after
// the write on the same queue pair, which executes its work in order, so
// it reaches the peer after the data. The hooks run before the write and
// before the done. It reports whether the write was posted. The nic
// copies in this goroutine (Config.InlineExec), with mu released; the writer's gate
// (Conn.wg) keeps x ours.
func (c *Conn) serveCTSLocked(x *txfer, flags uint8, before, after step) bool {
	local := x.src[x.ctsOff : x.ctsOff+x.ctsLen]
	wr := nic.SendWR{ID: wrWrite, Op: nic.OpWrite, Local: local, LKey: x.mr.LKey, Remote: x.ctsAddr, RKey: x.ctsKey}
	hook(before)
	x.cts, x.writing = false, true
	x.wOff, x.wLen = x.ctsOff, x.ctsLen
	c.mu.Unlock()
	err := c.qp.PostSend(wr)
	c.mu.Lock()
	if err != nil {
		x.writing = false
		c.sendFailedLocked(err)
		return false
	}
	c.stats.count(cRDMAWrites, 1)
	hook(after)
	c.queueCtlLocked(ctlMsg{typ: msgDone, flags: flags, id: x.id, off: x.wOff, size: x.wLen})
	return true
}

// splitRetry: after the peer left a split offer unsplit (its Read buffer
// was new, small, or not in huge pages), offer none for this long (a var
// for tests).
var splitRetry = 100 * time.Millisecond

// offerSplitLocked reports whether a read rendezvous of b registered in
// place is offered as a split transfer (offerSplit, policy.go), b being in
// huge pages. It may release mu (hugeUnlocked).
func (c *Conn) offerSplitLocked(b []byte) bool {
	f := splitOfferFacts{
		n: len(b), version: c.version, splitMin: c.cfg.SplitMin, mode: c.cfg.ZeroCopy,
		deadline: c.wdl.isSet.Load(), peerStages: c.peerStages, now: time.Now(), until: c.noSplitUntil,
		reused: c.reused, cached: func() bool { return c.dev.nic.Cached(b) },
		shared: c.sharedSource(b), bigWrite: c.bigWrite,
	}
	return offerSplit(&f) && c.hugeUnlocked(&c.hugeSrc, b)
}

// abandonTxLocked revokes a zero-copy source the peer has not finished
// with; the caller ends the connection.
func (c *Conn) abandonTxLocked(x *txfer) {
	if x.done || c.torn {
		return
	}
	for i, y := range c.txq {
		if y == x {
			c.txq = append(c.txq[:i:i], c.txq[i+1:]...)
			break
		}
	}
	c.releaseSourceLocked(x)
	if c.err == nil {
		c.abortLocked(&abortError{err: errors.New("zero-copy write abandoned")})
	}
}

// writeRendezvousLocked serves the peer's sinks: for each cts, an RDMA
// Write of that chunk, then done. A deadline, Close or failure while no
// RDMA Write is in flight cancels the rest.
func (c *Conn) writeRendezvousLocked(x *txfer, inline int) (int, error) {
	c.wtx = x
	defer func() {
		if c.wtx == x {
			c.wtx = nil
		}
		c.releaseSourceLocked(x)
	}()
	for x.off < x.size {
		if x.writing {
			// Our own RDMA Write: bounded, wait it out.
			c.waitLocked(nil, false)
			continue
		}
		if x.werr != nil {
			return inline + int(x.off), c.blameSourceLocked(x, x.werr)
		}
		if x.cts && c.err == nil && !c.qpDead && !c.closed {
			var flags uint8
			if c.version >= 4 {
				flags = flagChunk
			}
			c.serveCTSLocked(x, flags, stepBeforeWrite, stepBeforeWriteDone)
			continue
		}
		var err error
		switch {
		case c.err != nil:
			err = c.err
		case c.qpDead:
			err = c.failureLocked()
		case c.closed:
			err = net.ErrClosed
		case c.wdl.expired.Load():
			err = os.ErrDeadlineExceeded
		}
		if err != nil {
			if c.err == nil && !c.qpDead {
				c.queueCtlLocked(ctlMsg{typ: msgCancel, id: x.id, off: x.off})
				c.lastCancelled = x.id + 1
				c.stats.count(cCancels, 1)
			}
			return inline + int(x.off), c.blameSourceLocked(x, err)
		}
		c.waitLocked(&c.wdl, true)
	}
	return inline + int(x.size), nil
}
