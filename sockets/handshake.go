package sockets

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// nextOwner numbers connections as owners of cached registrations.
var nextOwner atomic.Uint64

// newConn sets a connection up on a connected queue pair: it registers
// the control-message pool and the doorbell, posts the receive buffers,
// and exchanges hellos (the dialer speaks first). On failure it releases
// everything, the device hold included.
func newConn(d *device, qp *nic.QueuePair, cq *nic.CompletionQueue, cfg Config, dialer bool, netw string, laddr, raddr net.Addr) (*Conn, error) {
	c := &Conn{
		cfg: cfg, dev: d, qp: qp, cq: cq, netw: netw, laddr: laddr, raddr: raddr,
		rdl: makeDeadline(), wdl: makeDeadline(),
		closing: make(chan struct{}), tornDown: make(chan struct{}),
		owner: nic.Owner(nextOwner.Add(1)),
	}
	c.stats.register()
	cq.SetWait(cfg.Wait) // the nic's waits are the connection's
	c.dialer = dialer
	c.bufSize = cfg.BufferSize
	c.window = uint32(cfg.Window)
	c.peerWindow = 1
	c.offerRead = !cfg.NoRDMARead && d.nic.Attr().RDMARead
	c.maxInline = d.nic.Attr().MaxInline
	c.replyLook = cfg.Wait.Mode == shm.WaitBlock && cfg.ReplyWait > 0
	c.replySpin = shm.NewWaitStrategy(shm.WaitConfig{Mode: shm.WaitBusyPoll})
	fail := func(err error) (*Conn, error) {
		c.mu.Lock()
		c.tearing = true
		c.mu.Unlock()
		c.teardown()
		return nil, err
	}
	var err error
	if c.bellMR, err = d.doorbell(); err != nil {
		return fail(err)
	}
	if err = d.checkStaging(); err != nil { // lowmem.go
		return fail(err)
	}
	dl := makeDeadline()
	dl.set(time.Now().Add(cfg.HandshakeTimeout))
	defer dl.set(time.Time{})
	c.mu.Lock()
	if dialer {
		if err := c.sendHelloLocked(); err != nil {
			c.mu.Unlock()
			return fail(err)
		}
	}
	spinEnd := time.Now().Add(handshakeSpin)
	for !c.helloDone && c.err == nil && !c.qpDead {
		if time.Now().Before(spinEnd) {
			c.mu.Unlock()
			c.spinHandshake(spinEnd)
			c.mu.Lock()
			continue
		}
		// Nap, do not sleep: a peer that refuses us hangs up at once
		// (see napCQ).
		gen := c.rounds
		c.mu.Unlock()
		err := c.progressMode(gen, &dl, false, true)
		c.mu.Lock()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.mu.Unlock()
			return fail(fmt.Errorf("sockets: handshake: %w", err))
		}
	}
	if c.err == nil && !c.qpDead && !dialer {
		c.sendHelloLocked()
	}
	err = c.err
	if err == nil && c.qpDead {
		err = &resetError{reason: "peer gone during the handshake"}
	}
	c.mu.Unlock()
	if err != nil {
		return fail(err)
	}
	return c, nil
}

// handshakeSpin is how long the handshake polls for the peer's hello
// before it naps: the hello is usually a few tens of microseconds away,
// and a nap is a timer, which the Go runtime rounds up to hundreds of
// microseconds (napCQ's first nap of 1 µs took 425 µs on average here).
const handshakeSpin = 300 * time.Microsecond

// spinHandshake polls the completion queue until something comes or end
// passes, and dispatches what came, as a round of progressMode would.
func (c *Conn) spinHandshake(end time.Time) {
	c.mu.Lock()
	if c.polling || c.torn {
		c.mu.Unlock()
		return
	}
	c.polling = true
	c.interesting = false
	c.repostLocked()
	c.mu.Unlock()
	n := 0
	for i := 1; ; i++ {
		if n = c.cq.Poll(c.comps[:]); n > 0 {
			break
		}
		if i%16 == 0 && time.Now().After(end) { // a poll is ~25 ns
			break
		}
	}
	c.mu.Lock()
	c.dispatchPolledLocked(n)
	c.endPollLocked()
	c.mu.Unlock()
}
