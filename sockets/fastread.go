package sockets

import "errors"

// The fast path of a Read (docs/performance.md, "A Read's fast path"):
// when nothing is queued for Read and the connection is in its plain
// state, the Read takes the ring's data messages itself and copies each
// payload straight into its buffer — no rx entry queued and read back, no
// hold of its ring space, one release. Anything else it meets (a control
// message, data larger than what is left of the buffer) it hands to the
// general dispatch, as a poller would, and stops there; readLoopLocked
// goes on from that state.

// readFastLocked delivers into b the data messages at the head of the
// ring, if the connection allows the fast path now. ok false: it
// delivered nothing, and the general path takes over (having lost
// nothing: what it took from the ring is queued as the general dispatch
// queues it).
func (c *Conn) readFastLocked(b []byte) (n int, ok bool) {
	if len(b) == 0 || c.polling || !c.fastReadyLocked() {
		return 0, false
	}
	c.polling = true // the ring's reader, as pollInlineLocked is
	took := false
	for n < len(b) && !c.torn && !c.qpDead && c.err == nil { // qpDead: ringEnd too
		data, start, got := c.nextMsgLocked()
		if !got {
			break
		}
		took = true
		if !c.takeDataLocked(b[n:], data, start, &n) {
			break
		}
	}
	if !took {
		// Nothing came: no round to end (it would wake waiters for
		// nothing). The general path waits.
		c.polling = false
		return 0, false
	}
	hook(stepDataTaken)
	c.releaseLocked()  // the ring space of what was read
	c.pumpReadLocked() // and its credit, when due
	c.endPollLocked()
	if n == 0 {
		return 0, false // what came is queued for the general path
	}
	c.stats.count(cInlineTakes, 1)
	return n, true
}

// fastReadyLocked tells whether the connection's state allows the fast
// path: plain, nothing queued for Read, no RDMA operation outstanding.
func (c *Conn) fastReadyLocked() bool {
	return !(c.torn || c.closed || c.err != nil || c.qpDead || !c.helloDone ||
		c.peerFin || c.lending || len(c.staged) > 0 || c.rxHead != len(c.rx) ||
		// As pollInlineLocked: no RDMA operation can be outstanding,
		// whose completion a poller would dispatch before the messages
		// that came after it.
		c.rd.active || c.wtx != nil || len(c.txq) > 0 || c.copyInFlight > 0 ||
		c.rdl.expired.Load())
}

// errNotData: a message the fast path leaves to the general dispatch.
var errNotData = errors.New("not a data message")

// fastTake is the message a fast path's copy is under way for.
type fastTake struct {
	active bool
	data   []byte // its payload, in the ring
	start  uint64 // its ring position
}

// abandonFastLocked, after a fault in a fast path's copy (endRead), queues
// the message the copy was for as the general dispatch queues it, and ends
// the fast path's round.
func (c *Conn) abandonFastLocked() {
	if !c.fast.active {
		return
	}
	e := rxEntry{kind: msgData, data: c.fast.data}
	c.holdLocked(&e, c.fast.start)
	c.pushRxLocked(e)
	c.fast = fastTake{}
	c.releaseLocked()
	c.endPollLocked()
}

// takeDataLocked copies msg, just taken from the ring at start, into dst
// and adds its length to *n when it is a data message that fits, and
// takes a credit message's ack; anything else goes to the general
// dispatch (onRecvLocked), and it returns false: the fast path ends there.
func (c *Conn) takeDataLocked(dst, msg []byte, start uint64, n *int) bool {
	var payload []byte
	var ack uint32
	var err error
	switch {
	case len(msg) == 0 || c.tooLong(msg):
		err = errNotData
	case msgType(msg[offType]) == msgShort && c.version >= shortVersion:
		ack, payload, err = shortFields(msg)
	case msgType(msg[offType]) == msgData:
		var h header
		h, payload, err = parseMessage(msg)
		ack = h.Ack()
	case msgType(msg[offType]) == msgCredit:
		// Its ack is all a credit message carries: the receive side's
		// to take, as onRecvLocked does, with no send half (a Write in
		// another goroutine waits for exactly this).
		h, _, perr := parseMessage(msg)
		if perr == nil {
			c.stats.count(cMsgsReceived, 1)
			if !c.creditedLocked(&h) {
				return false // aborted
			}
			c.consumeLocked(true)
			return true
		}
		err = perr
	default:
		err = errNotData
	}
	if err != nil || len(payload) > len(dst) {
		if err == nil {
			// More than the buffer holds: queued where it lies, for
			// readQueuedLocked.
			c.queueDataLocked(payload, ack, start)
			return false
		}
		// It aborts, or handles what is not data: the general path's
		// work, under both halves of Conn.mu.
		c.upgradeLocked()
		c.onRecvLocked(msg, start)
		return false
	}
	c.stats.count(cMsgsReceived, 1)
	if !c.creditLocked(msgData, ack) {
		return false // aborted
	}
	// dst is the application's and may fault: the Read's own fault
	// region (fault.go) then runs abandonFastLocked, which queues the
	// message as the general path would have it, nothing lost.
	c.readN = *n
	c.fast = fastTake{active: true, data: payload, start: start}
	k := copy(dst, payload)
	c.fast = fastTake{}
	*n += k
	c.consumeDataLocked(c.lastUnits)
	return true
}

// queueDataLocked takes a data message carrying ack, whose payload lies
// in the ring from position start, and queues the payload there, as the
// general dispatch does (onDataLocked; the fast path's state rules out
// what else it checks).
func (c *Conn) queueDataLocked(payload []byte, ack uint32, start uint64) {
	c.stats.count(cMsgsReceived, 1)
	if !c.creditLocked(msgData, ack) {
		return // aborted
	}
	e := rxEntry{kind: msgData, data: payload}
	c.holdLocked(&e, start)
	c.pushRxLocked(e)
}

// queuedReadyLocked tells whether a Read may take its bytes from the data
// at the head of the receive queue under the receive half alone
// (readQueuedLocked): the connection in its plain state, nothing staged
// and no rendezvous receive, and data first in the queue.
func (c *Conn) queuedReadyLocked() bool {
	return c.rxHead < len(c.rx) && c.rx[c.rxHead].kind == msgData && // first: the common case is an empty queue
		!(c.torn || c.closed || c.err != nil || !c.helloDone || c.lending ||
			len(c.staged) > 0 || c.rd.active || c.rdl.expired.Load())
}

// readQueuedLocked copies into b the data messages at the head of the
// receive queue — a message larger than the Read before it left the rest
// there — as the general path's readLocked does, and gives back their
// ring space and credit. A fault of b leaves the entry as it was (readN:
// fault.go).
func (c *Conn) readQueuedLocked(b []byte) int {
	n := 0
	for n < len(b) && c.rxHead < len(c.rx) && c.rx[c.rxHead].kind == msgData {
		c.readN = n
		n += c.takeQueuedLocked(b[n:])
	}
	c.releaseLocked()
	c.pumpReadLocked()
	return n
}
