package sockets

import "os"

// Credit accounting (docs/protocol.md, "Credits"): what the peer's window
// leaves us to send now, by message class; the checks of the peer's
// messages against ours and the acks we owe it; and a data message's wait
// for credits.

// credits returns how many more credit units the peer can take now.
func (c *Conn) creditsLocked() uint32 { return c.peerWindow - (c.sent.load() - c.peerAck.load()) }

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
	case msgData, msgShort, msgRTS:
		return classData
	case msgCredit, msgAbort:
		return classCredit
	}
	return classControl
}

// unitsOf is how many credit units a message of type t with a payload of
// n bytes counts: one, but two for a data message of more than one
// message's payload (from unitsVersion; maxData says so). Both sides
// compute it from the same lengths. A credit is a message's room in the
// ring, which holds the window and the padding of a wrap of up to two
// (ringCapacity): a message of two units fits where two of one do.
func (c *Conn) unitsOf(t msgType, n int) uint32 {
	if n > c.maxPayload && c.maxData > c.maxPayload && (t == msgShort || t == msgData) {
		return 2
	}
	return 1
}

// msgUnits is unitsOf of a message as it lies in the ring, unchecked: it
// reads the type once more than the parse does, and a peer that changes
// it in between misleads only the credit count of its own connection
// (received against consumed: fewer credits back, an earlier abort), never
// a length or an index this side uses.
func (c *Conn) msgUnits(msg []byte) uint32 {
	if len(msg) <= c.maxPayload+shortHeaderSize || c.maxData == c.maxPayload {
		return 1 // no header is shorter than a short one's
	}
	if t, n, ok := dataPayload(msg); ok {
		return c.unitsOf(t, n)
	}
	return 1
}

// msgLimit is the largest message of msg's type we take: a data message
// of maxData bytes, anything else one of bufSize. Not inlined: tooLong,
// on every message's path, stays small enough to be, and calls it only
// for a message longer than bufSize.
//
//go:noinline
func (c *Conn) msgLimit(msg []byte) int {
	if _, n, ok := dataPayload(msg); ok && c.maxData > c.maxPayload {
		return len(msg) - n + c.maxData // its header's length, and maxData
	}
	return c.bufSize
}

// dataPayload tells whether msg, as it lies in the ring, is a data
// message by its type, and its payload's length if so.
func dataPayload(msg []byte) (t msgType, n int, ok bool) {
	if len(msg) == 0 {
		return 0, 0, false
	}
	switch t = msgType(msg[offType]); t {
	case msgShort:
		return t, len(msg) - shortHeaderSize, true
	case msgData:
		return t, len(msg) - headerSize, true
	}
	return 0, 0, false
}

// tooLong tells whether msg is longer than msgLimit allows; most messages
// are no longer than bufSize, which every type allows.
func (c *Conn) tooLong(msg []byte) bool {
	return len(msg) > c.bufSize && len(msg) > c.msgLimit(msg)
}

// canSendLocked tells whether a message of class k may go now: a free
// send buffer and the credits its class needs.
func (c *Conn) canSendLocked(k class) bool {
	if c.qpDead || c.torn || !c.helloDone {
		return false
	}
	return c.creditsLocked() >= uint32(k)
}

// ackableLocked is the ack our next message may carry: what we consumed,
// or while received data is lent (copy.go) what we could acknowledge when
// the lend began — the ring space of what came since is not given back
// yet.
func (c *Conn) ackableLocked() uint32 {
	if c.lending {
		return c.lendAck
	}
	return c.ackBoundLocked()
}

// ackBoundLocked is what we consumed, but no more than the messages before
// the first one whose ring space is held by unread data: an ack tells the
// peer that the ring space of that many of its messages is free. Handled
// messages behind unread data (a peer's done behind the data our reader
// has not read yet: both directions share the ring) are acknowledged once
// the data is read, or moved to the heap when the peer runs short of
// credit (releaseLocked). Both terms only grow, so the ack does too.
func (c *Conn) ackBoundLocked() uint32 {
	if e := c.firstHeldLocked(); e != nil {
		if b := uint32(e.seq); int32(b-c.consumed) < 0 {
			return b
		}
	}
	return c.consumed
}

// consumeLocked counts a message of one unit we are done with: its
// credit goes back to the peer with our next ack (its ring space first:
// releaseLocked).
func (c *Conn) consumeLocked(credit bool) {
	c.consumed++
	if !credit {
		c.owedAt = c.consumed
	}
}

// consumeDataLocked is consumeLocked of a data message of units credits.
func (c *Conn) consumeDataLocked(units uint32) {
	c.consumed += units
	c.owedAt = c.consumed
}

// creditedLocked counts a message that came and takes its ack, and
// aborts the connection if the peer had no credit for it or acknowledges
// messages never sent. Credits: the peer may have at most window units
// unacknowledged, the last two of which only for control and credit
// messages, the last one only for credit messages and aborts. The message
// is the one nextMsgLocked took last (lastUnits).
func (c *Conn) creditedLocked(h *header) bool { return c.creditLocked(h.Type(), h.Ack()) }

// creditLocked is creditedLocked of a message of type t carrying ack.
func (c *Conn) creditLocked(t msgType, ack uint32) bool {
	limit := c.window - uint32(classOf(t)) + 1
	ackSent := c.ackSent.load()
	u := c.lastUnits
	if c.received-ackSent+u > limit {
		c.upgradeLocked()
		c.abortLocked(protoErr("%v sent without credit: %d unacknowledged, window %d", t, c.received-ackSent+u, c.window))
		return false
	}
	c.received += u
	peerAck, sent := c.peerAck.load(), c.sent.load()
	if ack-peerAck > sent-peerAck {
		c.upgradeLocked()
		c.abortLocked(protoErr("ack %d of messages never sent (sent %d, acked %d)", ack, sent, peerAck))
		return false
	}
	c.peerAck.store(ack)
	return true
}

// waitSendLocked waits until a data message may go: no control message
// queued ahead, a free send buffer, and a credit beyond the reserved ones.
func (c *Conn) waitSendLocked() error {
	stalled := false
	for {
		if err := c.writableLocked(); err != nil {
			return err
		}
		if len(c.ctlq) == 0 && c.canSendLocked(classData) {
			return nil // the data message carries our ack: no credit message first
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
