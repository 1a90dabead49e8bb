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
	c.dialer = dialer
	c.bufSize = cfg.BufferSize
	c.window = uint32(cfg.Window)
	c.peerWindow = 1
	c.offerRead = !cfg.NoRDMARead && d.nic.Attr().RDMARead
	c.maxInline = d.nic.Attr().MaxInline
	c.replyLook = cfg.Wait.Mode == shm.WaitBlock && cfg.ReplyWait > 0
	fail := func(err error) (*Conn, error) {
		c.mu.Lock()
		c.tearing = true
		c.mu.Unlock()
		c.teardown()
		return nil, err
	}
	B, W, S := cfg.BufferSize, cfg.Window, cfg.SendBuffers
	var err error
	if c.pool, err = d.getPool((W + S) * B); err != nil {
		return fail(err)
	}
	if c.bellMR, err = d.doorbell(); err != nil {
		return fail(err)
	}
	if err = d.checkStaging(); err != nil { // lowmem.go
		return fail(err)
	}
	recv, send := c.pool.buf[:W*B], c.pool.buf[W*B:]
	for i := 0; i < W; i++ {
		c.recvBufs = append(c.recvBufs, recv[i*B:(i+1)*B:(i+1)*B])
		if err := qp.PostRecv(nic.RecvWR{ID: wrRecv | uint64(i), Buf: c.recvBufs[i], LKey: c.pool.mr.LKey}); err != nil {
			return fail(fmt.Errorf("sockets: post receive: %w", err))
		}
		c.posted++
	}
	for i := 0; i < S; i++ {
		c.sendBufs = append(c.sendBufs, send[i*B:(i+1)*B:(i+1)*B])
		c.sendFree = append(c.sendFree, S-1-i)
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
	for !c.helloDone && c.err == nil && !c.qpDead {
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
