package sockets

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sandirect/sandirect/internal/gopool"
	"github.com/sandirect/sandirect/nic"
)

// The end of a connection: abort (ours), reset (the peer's) and a failed
// queue pair, which set the error every call returns; the linger of a
// closed connection; and the teardown that releases what it holds.

var (
	errUnread   = errors.New("closed with unread data")
	errLateData = errors.New("data arrived after close")
)

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

// qpFailedLocked records that the queue pair failed where the stream we
// receive breaks too — an RDMA operation of a rendezvous, whose bytes
// can no longer come: the connection ends now (ringEndLocked).
func (c *Conn) qpFailedLocked(reason error) {
	if !c.ringEnd {
		c.ringEndLocked(reason)
	}
}

// sendFailedLocked records that the queue pair failed under one of our
// sends: the peer hung up or died. Writes fail from now on, but what the
// peer sent before it went — data, its fin — is still in the ring, and
// Reads get it: the poller drains the ring and ends the connection at its
// end (ringEndLocked). Ending it here lost that data (a peer that writes
// and closes, then our Write: its bytes and its EOF gone).
func (c *Conn) sendFailedLocked(reason error) {
	if c.qpDead {
		return
	}
	c.qpDead, c.qpReason = true, reason
	if c.err == nil && !c.closed && isRemoteAccess(reason) {
		c.ringEnd = true
		c.abortLocked(descriptorErr(reason))
		return
	}
	c.wakeLocked() // a sleeping poller drains the ring
	if c.closed || c.err != nil {
		c.teardownLocked()
	}
}

// ringEndLocked records that nothing more comes in the ring: it ended
// (the queue pair failed, and what the peer sent before is taken), or the
// stream broke. A fin taken before makes the end an EOF for Reads
// (Writes fail); otherwise the connection is reset.
func (c *Conn) ringEndLocked(reason error) {
	c.ringEnd = true
	if !c.qpDead {
		c.qpDead, c.qpReason = true, reason
	}
	if c.err == nil && !c.closed {
		if isRemoteAccess(c.qpReason) {
			c.abortLocked(descriptorErr(c.qpReason))
			return
		}
		if !c.peerFin {
			c.resetLocked(&resetError{reason: goneReason(c.qpReason)})
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

// failureLocked is the error of a call that cannot go on because the
// queue pair failed: the connection's error, or the queue pair's reason.
func (c *Conn) failureLocked() error {
	if c.err != nil {
		return c.err
	}
	return &resetError{reason: goneReason(c.qpReason)}
}

// isRemoteAccess tells whether err is a completion the peer refused
// access for: a descriptor it gave us was wrong.
func isRemoteAccess(err error) bool {
	var ce *nic.CompletionError
	return errors.As(err, &ce) && ce.Status == nic.StatusRemoteAccess
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
	gopool.Go(c.teardown)
}

// linger delivers what a closed connection wrote: it sends the queued
// messages and waits until the peer consumed all of them, or the peer
// went, or Config.Linger passed; then it tears the connection down.
func (c *Conn) linger() {
	var dl deadline
	dl.init()
	dl.set(time.Now().Add(c.cfg.Linger))
	c.mu.Lock()
	for !c.qpDead && c.err == nil && !c.torn {
		c.pumpLocked()
		if len(c.ctlq) == 0 && int32(c.peerAck.load()-c.lastNonCredit) >= 0 && len(c.txq) == 0 {
			break
		}
		err := c.progressLocked(c.rounds, &dl, false, false)
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
		c.mu.Lock()
		c.rg.enterLocked(&c.mu)
		c.wg.enterLocked(&c.mu)
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
		c.wg.leaveLocked()
		c.rg.leaveLocked()
		c.mu.Unlock()
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
