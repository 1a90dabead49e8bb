package sockets

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/nic"
)

// waitSendLocked waits until a data message may go: no control message
// queued ahead, a free send buffer, and a credit beyond the reserved ones.
func (c *Conn) waitSendLocked() error {
	stalled := false
	for {
		if err := c.writableLocked(); err != nil {
			return err
		}
		c.pumpLocked()
		if len(c.ctlq) == 0 && c.canSendLocked(classData) {
			return nil
		}
		if c.wdl.expired.Load() {
			return os.ErrDeadlineExceeded
		}
		if !stalled {
			stalled = true
			c.stats.count(cCreditStalls, 1)
		}
		err := c.waitLocked(&c.wdl, true)
		if err != nil {
			if werr := c.writableLocked(); werr != nil {
				return werr
			}
			return err
		}
	}
}

// waitLocked runs progress with mu released.
func (c *Conn) waitLocked(dl *deadline, stopOnClose bool) error {
	gen := c.rounds
	c.mu.Unlock()
	err := c.progress(gen, dl, stopOnClose)
	c.mu.Lock()
	return err
}

// sendDataLocked sends the first bytes of b in one data message.
func (c *Conn) sendDataLocked(b []byte) (int, error) {
	if err := c.waitSendLocked(); err != nil {
		return 0, err
	}
	m := min(len(b), c.maxPayload)
	var h header
	h.SetType(msgData)
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
		peerStages: c.peerStages, reused: c.reused,
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
			body = body[:min(len(body), copyChunk(len(body), c.cfg.CopyChunk, c.cfg.MaxCopyInFlight))]
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
func copyChunk(rest, chunk, inFlight int) int {
	const large, piece = 8 << 20, 2 << 20
	if rest >= large && chunk < piece && inFlight >= 2*piece {
		return piece
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
		size = min(size, copyChunk(len(body), c.cfg.CopyChunk, c.cfg.MaxCopyInFlight))
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
				c.stats.count(cBytesSplitTail, uint64(x.ctsLen))
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
			err = &resetError{reason: "peer gone"}
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
// copies in this goroutine (Config.InlineExec), with mu released; wmu
// keeps x ours.
func (c *Conn) serveCTSLocked(x *txfer, flags uint8, before, after step) bool {
	local := x.src[x.ctsOff : x.ctsOff+x.ctsLen]
	wr := nic.SendWR{ID: wrWrite, Op: nic.OpWrite, Local: local, LKey: x.mr.LKey, Remote: x.ctsAddr, RKey: x.ctsKey}
	hook(before)
	x.cts, x.writing = false, true
	c.mu.Unlock()
	err := c.qp.PostSend(wr)
	c.mu.Lock()
	if err != nil {
		x.writing = false
		c.qpFailedLocked(err)
		return false
	}
	c.stats.count(cRDMAWrites, 1)
	hook(after)
	c.queueCtlLocked(ctlMsg{typ: msgDone, flags: flags, id: x.id, off: x.ctsOff, size: x.ctsLen})
	return true
}

// splitRetry: after the peer left a split offer unsplit (its Read buffer
// was new, small, or not in huge pages), offer none for this long (a var
// for tests).
var splitRetry = 100 * time.Millisecond

// hugeBacked asks the kernel to back b with huge pages and reports
// whether they cover at least half of it (sys.CollapseHuge). Tests
// replace it to split transfers on any memory.
var hugeBacked = func(b []byte) bool {
	n, err := sys.CollapseHuge(b)
	return err == nil && 2*n >= len(b)
}

// hugeLocked reports whether b is in huge pages (hugeBacked), asking the
// kernel only when b is not inside *last, the last buffer found so: the
// first collapse of a buffer is slow, later answers are quick
// (docs/performance.md). It holds mu throughout; hugeUnlocked does not.
func (c *Conn) hugeLocked(last *span, b []byte) bool {
	if last.covers(b) {
		return true
	}
	ok := hugeBacked(b)
	if ok {
		*last = span{addr: mem.Addr(b), n: uintptr(len(b))}
	}
	return ok
}

// hugeUnlocked is hugeLocked for a caller that holds mu and lets it go
// while the kernel collapses b (a new buffer's first collapse takes
// milliseconds); *last is written under mu.
func (c *Conn) hugeUnlocked(last *span, b []byte) bool {
	if last.covers(b) {
		return true
	}
	c.mu.Unlock()
	ok := hugeBacked(b)
	c.mu.Lock()
	if ok {
		*last = span{addr: mem.Addr(b), n: uintptr(len(b))}
	}
	return ok
}

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

// acceptSplitLocked reports whether we take a transfer the sender offered
// split, reading all of it into dst (acceptSplit, policy.go), dst being in
// huge pages.
func (c *Conn) acceptSplitLocked(dst []byte) bool {
	return acceptSplit(len(dst), c.cfg.SplitMin, c.lastRead.covers(dst), func() bool { return c.dev.nic.Cached(dst) }) &&
		c.hugeLocked(&c.hugeDst, dst)
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
			err = &resetError{reason: "peer gone"}
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
	if x.cts || x.writing {
		c.abortLocked(protoErr("cts for transfer %d while a chunk is in progress", h.ID()))
		return
	}
	if h.Offset() != x.off || h.Size() > x.size-x.off {
		c.abortLocked(protoErr("cts chunk [%d, +%d) of transfer %d: %d of %d bytes written", h.Offset(), h.Size(), h.ID(), x.off, x.size))
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
			c.qpFailedLocked(err)
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
		x.off = x.ctsOff + x.ctsLen
		c.stats.count(cBytesWriteRdv, uint64(x.ctsLen))
	}
}

// popRxLocked drops the head of the receive queue.
func (c *Conn) popRxLocked() {
	c.unholdLocked(&c.rx[c.rxHead])
	c.rx[c.rxHead] = rxEntry{}
	c.rxHead++
	if c.rxHead == len(c.rx) {
		c.rx, c.rxHead = c.rx[:0], 0
	}
}

// readLocked delivers into b[n:] what has arrived, starting the
// rendezvous receive that the head of the queue needs. It returns the new
// n and whether the caller must wait for progress to get more.
func (c *Conn) readLocked(b []byte, n int) (int, bool, error) {
	for n < len(b) {
		c.readN = n // what a fault in the copies below leaves delivered (fault.go)
		if len(c.staged) > 0 {
			k := copy(b[n:], c.staged)
			c.staged = c.staged[k:]
			n += k
			if len(c.staged) == 0 {
				c.staged = nil
				c.releaseStageLocked()
			}
			continue
		}
		if c.rd.active {
			op := &c.rd
			sink := c.sinkLocked(b[n:]) // to blame if it faults (fault.go)
			if !op.done && !op.cancelled {
				if (!op.read || op.split && op.readDone) && (c.err != nil || c.closed || c.qpDead) {
					// The sender will not serve our sink any more.
					err := c.abandonRecvLocked()
					return n, false, c.blameLocked(sink, "read", err)
				}
				return n, true, nil
			}
			k, err := c.finishRecvLocked()
			if err != nil {
				return n, false, c.blameLocked(sink, "read", err)
			}
			n += k
			continue
		}
		if c.rxHead == len(c.rx) {
			return n, true, nil
		}
		e := &c.rx[c.rxHead]
		switch e.kind {
		case msgFin:
			if n > 0 {
				return n, false, nil
			}
			return 0, false, io.EOF
		case msgData:
			k := copy(b[n:], e.data)
			e.data = e.data[k:]
			n += k
			if len(e.data) == 0 {
				c.consumeLocked(false)
				c.popRxLocked()
			}
		case msgRTS:
			if len(e.data) > 0 {
				k := copy(b[n:], e.data)
				e.data = e.data[k:]
				n += k
				continue
			}
			if e.off == e.size {
				c.finishRTSLocked()
				continue
			}
			if n > 0 && len(b)-n < c.cfg.DirectRead {
				return n, false, nil
			}
			if c.err != nil || c.qpDead || c.torn {
				// No rendezvous byte can come any more; a receive
				// started now would register a buffer that a torn
				// connection never deregisters.
				if c.err != nil {
					return n, false, c.err
				}
				return n, false, &resetError{reason: "peer gone"}
			}
			if err := c.startRecvLocked(e, b[n:]); err != nil {
				return n, false, err
			}
		}
	}
	c.tidyRxLocked()
	return n, false, nil
}

// finishRTSLocked ends the transfer at the head of the queue, all of it
// received: done for a read rendezvous, and the rts buffer is consumed.
func (c *Conn) finishRTSLocked() {
	e := &c.rx[c.rxHead]
	if e.read && e.size > 0 {
		hook(stepBeforeReadDone)
		var flags uint8
		if e.staged && c.version >= 2 {
			flags = flagStaged
		}
		c.queueCtlLocked(ctlMsg{typ: msgDone, flags: flags, id: e.id, size: e.size})
	}
	c.consumeLocked(false)
	c.popRxLocked()
}

// tidyRxLocked ends the transfers at the head of the queue whose bytes
// were all read, so that the peer hears done without waiting for another
// Read.
func (c *Conn) tidyRxLocked() {
	for c.rxHead < len(c.rx) && !c.rd.active {
		e := &c.rx[c.rxHead]
		if e.kind != msgRTS || len(e.data) > 0 || e.off != e.size {
			return
		}
		c.finishRTSLocked()
	}
}

// startRecvLocked starts receiving the next chunk of the rendezvous e:
// into dst itself when it is large enough (or takes the whole rest),
// otherwise into the staging buffer.
func (c *Conn) startRecvLocked(e *rxEntry, dst []byte) error {
	rem := e.size - e.off
	direct := len(dst) >= c.cfg.DirectRead || uint32(len(dst)) >= rem
	if direct && !c.dev.pinnable(len(dst)) {
		direct = false // staged (lowmem.go)
		c.stats.count(cFallbacks, 1)
	}
	if !e.read && c.rdl.isSet.Load() {
		// A direct sink must be served before Read returns; with a
		// deadline, use the staging buffer, which may be left behind.
		direct = false
	}
	// Split only without a read deadline: the sender's tail must land
	// before Read returns, as a direct sink of the write rendezvous must.
	split := direct && e.read && e.split && e.off == 0 && uint32(len(dst)) >= rem &&
		!c.rdl.isSet.Load() && c.acceptSplitLocked(dst[:rem])
	access := nic.AccessLocalWrite
	if !e.read || split {
		access |= nic.AccessRemoteWrite
	}
	var buf []byte
	var mr *nic.MemoryRegion
	var err error
	if direct {
		if !c.lastRead.covers(dst) {
			c.lastRead = span{addr: mem.Addr(dst), n: uintptr(len(dst))}
		}
		buf = dst[:min(uint32(len(dst)), rem)]
		if mr, err = c.dev.register(c.owner, buf, access); err != nil {
			direct, split = false, false
			c.stats.count(cFallbacks, 1)
		}
	}
	if !direct {
		e.staged = true
		if buf, mr, err = c.stageLocked(rem, access); err != nil { // lowmem.go
			return err
		}
	}
	c.stats.count(cRegisters, 1)
	// A Read into a very large buffer: what lands first leaves the caches
	// before the application gets to it anyway, and cached stores would
	// first read every line of it in.
	nt := e.read && direct && len(dst) >= ntReadMin
	c.rd = recvOp{active: true, direct: direct, nt: nt, read: e.read, id: e.id, off: e.off, n: uint32(len(buf)), mr: mr}
	if direct {
		hook(stepSinkReady)
	}
	local := buf
	if split {
		local = c.startSplitLocked(e, buf, mr)
	}
	if e.read {
		// The nic copies in this goroutine (Config.InlineExec): not under
		// mu. rmu keeps the receive side ours; the completion is
		// dispatched like any other.
		wr := nic.SendWR{ID: wrRead, Op: nic.OpRead, Local: local, LKey: mr.LKey, Remote: e.addr + uint64(e.off), RKey: e.rkey, NonTemporal: c.rd.nt}
		c.mu.Unlock()
		err := c.qp.PostSend(wr)
		c.mu.Lock()
		if err != nil && c.rd.active {
			c.rd = recvOp{}
			c.dev.nic.Deregister(mr)
			c.qpFailedLocked(err)
			if direct {
				// A split's tail may have failed the queue pair.
				return c.blameLocked(buf, "read", c.writableLocked())
			}
			return c.writableLocked()
		}
		c.stats.count(cRDMAReads, 1)
		return nil
	}
	c.queueCtlLocked(ctlMsg{typ: msgCTS, id: e.id, off: e.off, size: uint32(len(buf)), addr: uint64(mr.Addr), rkey: mr.RKey})
	return nil
}

// startSplitLocked makes the receive of e into buf (all of it, registered as
// mr for local and remote write) a split transfer: a cts asks the sender
// for the tail, and it returns the head, which we RDMA-Read meanwhile.
func (c *Conn) startSplitLocked(e *rxEntry, buf []byte, mr *nic.MemoryRegion) []byte {
	n := uint32(len(buf))
	head := n / 2 &^ uint32(sys.PageSize-1) // SplitMin ≥ two pages: head and tail not empty
	op := &c.rd
	op.nt = false // cross-process copies store through the caches
	op.split, op.tailOff, op.tailLen = true, head, n-head
	c.stats.count(cSplits, 1)
	c.queueCtlLocked(ctlMsg{typ: msgCTS, flags: flagSplit, id: e.id, off: head, size: n - head, addr: uint64(mr.Addr) + uint64(head), rkey: mr.RKey})
	hook(stepSplitCTSSent)
	return buf[:head]
}

// ntReadMin is the Read buffer from which direct RDMA Reads write with
// non-temporal stores (a ReadFull of 16 MiB: all but its last 2 MiB).
// Large streams gain; smaller Reads, whose data stays in the caches, lost
// (docs/performance.md, "Non-temporal direct reads").
const ntReadMin = 2 << 20

// finishRecvLocked ends the receive operation, which completed or was
// cancelled, and returns how many bytes it put into the Read's buffer.
func (c *Conn) finishRecvLocked() (int, error) {
	op := c.rd
	c.rd = recvOp{}
	if op.mr != nil && !c.torn {
		c.dev.nic.Deregister(op.mr)
	}
	if op.err != nil {
		if c.err != nil {
			return 0, c.err
		}
		return 0, op.err
	}
	if op.cancelled {
		c.releaseStageLocked()
		return 0, nil
	}
	e := &c.rx[c.rxHead]
	e.off += op.n
	if op.direct {
		c.stats.count(cBytesDirect, uint64(op.n))
		if op.nt {
			c.stats.count(cBytesDirectNT, uint64(op.n))
		}
		return int(op.n), nil
	}
	c.stats.count(cBytesStaged, uint64(op.n))
	c.staged = c.stage[:op.n]
	return 0, nil
}

// abandonRecvLocked revokes a sink the sender will not serve (the
// connection failed or is closing) and returns why.
func (c *Conn) abandonRecvLocked() error {
	op := c.rd
	c.rd = recvOp{}
	if op.mr != nil && !c.torn {
		c.dev.nic.Deregister(op.mr)
	}
	if !op.direct && c.stage != nil {
		c.dev.dropTemp(c.stage) // it may still be written: never reuse it
		c.stage, c.staged = nil, nil
	}
	switch {
	case c.closed:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	}
	return &resetError{reason: "peer gone"}
}

// releaseStageLocked gives the staging buffer back when it is idle.
func (c *Conn) releaseStageLocked() {
	if c.stage != nil && len(c.staged) == 0 && !c.rd.active && !c.torn {
		c.dev.putTemp(c.stage)
		c.stage = nil
	}
}
