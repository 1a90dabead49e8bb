package sockets

import (
	"bytes"
	"io"
	"net"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/nic"
)

// The receive path: received messages queued for Read (rx entries) and the
// ring space they hold, Reads out of them, and rendezvous and split
// transfers from the receiver's side — its RDMA Reads, sinks and staging.

// releaseLocked gives the peer back the ring space of the messages before
// the first one the application has not read. When handled messages wait
// behind unread data (a control message behind data nobody reads yet) and
// the peer runs short of credit because of it, or either side is closing,
// the unread bytes move to the heap and all of it goes back: the peer's
// control messages must always find room, and what the application does
// not read still holds its credit, so the heap holds at most a window.
// While the peer has credit to spare the data stays where it lies, for a
// Read that comes soon: in a stream both ways at once, every ring holds
// one direction's data and the other's control messages, and moving the
// data on each of those cost a copy and an allocation per message
// (docs/performance.md, "Both directions at once").
func (c *Conn) releaseLocked() {
	if c.torn {
		return
	}
	if c.relPos != c.inPos {
		c.releaseRingLocked()
	}
	c.ackPub.store(c.ackableLocked()) // for a fast Write's messages
}

// releaseRingLocked is releaseLocked's release of ring space.
func (c *Conn) releaseRingLocked() {
	to := c.inPos
	if e := c.firstHeldLocked(); e != nil {
		to = e.start
	}
	if c.lending {
		// Nothing from the lent message on goes back (and spilling would
		// not change that): acks stop at lendAck meanwhile.
		to = min(to, c.lendStart)
	} else if to != c.inPos && c.blockedLocked() && c.mustSpillLocked() {
		c.spillLocked()
		to = c.inPos
	}
	if to > c.relPos {
		c.qp.ReleaseRecv(to)
		c.relPos = to
	}
}

// mustSpillLocked tells whether blocked ring space must go back now: the
// acks that unread data holds back leave the peer less credit than a
// control message needs (it may be waiting to send us the done or cts our
// writer waits for; data the application does not read holds the peer's
// data back anyway), or a side is closing (a closer waits for our acks).
func (c *Conn) mustSpillLocked() bool {
	return c.window-(c.received-c.ackBoundLocked()) < uint32(classControl) || c.peerFin || c.closed || c.wclosed
}

// blockedLocked tells whether a handled message waits behind unread data:
// more credit units were taken since the first held entry than are held.
func (c *Conn) blockedLocked() bool {
	e := c.firstHeldLocked()
	return e != nil && c.taken-e.seq > uint64(c.heldN)
}

// firstHeldLocked returns the first rx entry that holds ring space, or nil.
func (c *Conn) firstHeldLocked() *rxEntry {
	if c.heldN == 0 {
		return nil
	}
	for i := c.rxHead; i < len(c.rx); i++ {
		if e := &c.rx[i]; e.held {
			return e
		}
	}
	return nil
}

// holdLocked makes e, about to be queued, hold the ring space of the
// message just taken from position start (its units: lastUnits).
func (c *Conn) holdLocked(e *rxEntry, start uint64) {
	e.units = c.lastUnits
	e.held, e.start, e.seq = true, start, c.taken-uint64(e.units)
	c.heldN += int(e.units)
}

// unholdLocked ends e's hold (read, or moved to the heap).
func (c *Conn) unholdLocked(e *rxEntry) {
	if e.held {
		e.held = false
		c.heldN -= int(e.units)
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

// takeQueuedLocked copies the data at the head of the receive queue, a
// data entry, into dst, and consumes and drops the entry once it is read
// whole. It returns how many bytes it copied.
func (c *Conn) takeQueuedLocked(dst []byte) int {
	e := &c.rx[c.rxHead]
	k := copy(dst, e.data)
	e.data = e.data[k:]
	if len(e.data) == 0 {
		c.consumeDataLocked(e.units)
		c.popRxLocked()
	}
	return k
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

// repostLocked gives back the ring space of what was read.
func (c *Conn) repostLocked() { c.releaseLocked() }

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
				if (!op.read || op.split && op.readDone) && (c.err != nil || c.closed || c.ringEnd) {
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
			n += c.takeQueuedLocked(b[n:])
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
				return n, false, c.failureLocked()
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
	splittable := direct && e.read && e.split && e.off == 0 && uint32(len(dst)) >= rem &&
		!c.rdl.isSet.Load() && c.acceptSplitLocked(dst[:rem])
	access := nic.AccessLocalWrite
	if !e.read {
		access |= nic.AccessRemoteWrite
	}
	var buf []byte
	var mr *nic.MemoryRegion
	var err error
	split := false
	if direct {
		if !c.lastRead.covers(dst) {
			c.lastRead = span{addr: mem.Addr(dst), n: uintptr(len(dst))}
		}
		buf = dst[:min(uint32(len(dst)), rem)]
		if mr, split, err = c.registerReadLocked(buf, access, splittable); err != nil {
			direct = false
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
		// mu. The reader's gate (Conn.rg) keeps the receive side ours; the completion is
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

// acceptSplitLocked reports whether we may take a transfer the sender
// offered split, reading all of it into dst (acceptSplit, policy.go), if
// dst is in huge pages, which registerReadLocked asks.
func (c *Conn) acceptSplitLocked(dst []byte) bool {
	return acceptSplit(len(dst), c.cfg.SplitMin, c.lastRead.covers(dst), func() bool { return c.dev.nic.Cached(dst) })
}

// registerReadLocked registers buf, the Read buffer of a direct receive,
// with access, and tells whether the transfer goes split: splittable (a
// read rendezvous offered split, acceptSplitLocked) and buf in huge pages,
// registered then for remote write too. The kernel is asked only once buf
// is registered: the registration locks its pages as one range, while
// earlier receives into it (the copied pieces of a write, each its own
// registration, the bytes inline in their rts between them) may have
// left it locked in stretches, and the kernel collapses no huge page
// across stretches locked and not (MADV_COLLAPSE fails with EINVAL).
func (c *Conn) registerReadLocked(buf []byte, access nic.Access, splittable bool) (*nic.MemoryRegion, bool, error) {
	if splittable && c.hugeDst.covers(buf) {
		mr, err := c.dev.register(c.owner, buf, access|nic.AccessRemoteWrite)
		return mr, err == nil, err
	}
	mr, err := c.dev.register(c.owner, buf, access)
	if err != nil || !splittable || !c.hugeLocked(&c.hugeDst, buf) {
		return mr, false, err
	}
	// In huge pages now: registered again, writable by the peer too (its
	// pages locked already).
	c.dev.nic.Deregister(mr)
	if mr, err = c.dev.register(c.owner, buf, access|nic.AccessRemoteWrite); err != nil {
		return nil, false, err
	}
	return mr, true, nil
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
	if c.closed {
		return net.ErrClosed
	}
	return c.failureLocked()
}

// releaseStageLocked gives the staging buffer back when it is idle.
func (c *Conn) releaseStageLocked() {
	if c.stage != nil && len(c.staged) == 0 && !c.rd.active && !c.torn {
		c.dev.putTemp(c.stage)
		c.stage = nil
	}
}
