package sockets

import "os"

// Credit accounting (docs/protocol.md, "Credits"): what the peer's window
// leaves us to send now, by message class; the checks of the peer's
// messages against ours and the acks we owe it; and a data message's wait
// for credits.

// credits returns how many more messages the peer can take now.
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

// consumeLocked counts a message we are done with: its credit goes back
// to the peer with our next ack (its ring space first: releaseLocked).
func (c *Conn) consumeLocked(credit bool) {
	c.consumed++
	if !credit {
		c.owedAt = c.consumed
	}
}

// creditedLocked counts a message that came and takes its ack, and
// aborts the connection if the peer had no credit for it or acknowledges
// messages never sent. Credits: the peer may have at most window messages
// unacknowledged, the last two of which only for control and credit
// messages, the last one only for credit messages and aborts.
func (c *Conn) creditedLocked(h *header) bool { return c.creditLocked(h.Type(), h.Ack()) }

// creditLocked is creditedLocked of a message of type t carrying ack.
func (c *Conn) creditLocked(t msgType, ack uint32) bool {
	limit := c.window - uint32(classOf(t)) + 1
	ackSent := c.ackSent.load()
	if c.received-ackSent >= limit {
		c.upgradeLocked()
		c.abortLocked(protoErr("%v sent without credit: %d unacknowledged, window %d", t, c.received-ackSent+1, c.window))
		return false
	}
	c.received++
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
