package sockets

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// The session hellos travel in the connection manager's handshake, as
// its private data (nic.QPOptions.PrivateData): the dialer's with its
// request, the acceptor's with its reply. Each is the hello message of
// the session protocol, header and payload (docs/protocol.md), and
// neither is counted as a message on the rings. A connection is thus
// ready when the nic handshake ends, after one round trip, and neither
// side waits on the rings for the other's hello.

// nextOwner numbers connections as owners of cached registrations.
var nextOwner atomic.Uint64

// prepareHello readies what a hello names before the handshake: the
// device's doorbell, and a page of temporary memory that can be pinned
// (checkStaging). It returns the doorbell.
func prepareHello(d *device) (*nic.MemoryRegion, error) {
	bell, err := d.doorbell()
	if err != nil {
		return nil, err
	}
	now := time.Now().UnixNano()
	if now-d.probed.Load() < int64(stagingProbeTTL) {
		return bell, nil
	}
	if err := d.checkStaging(); err != nil { // lowmem.go
		return nil, err
	}
	d.probed.Store(now)
	return bell, nil
}

// stagingProbeTTL is how long a staging probe that succeeded vouches for
// the device's next connections. The probe maps, pins, unpins and unmaps
// a page: on every dial and every accept it was a third of what a dial
// cost (docs/setup.md). A device's first connection always probes, and a
// failure is never remembered.
const stagingProbeTTL = 100 * time.Millisecond

// configVersions returns the session versions a connection of cfg speaks.
func configVersions(cfg *Config) (lo, hi uint16) {
	if cfg.versions != [2]uint16{} {
		return cfg.versions[0], cfg.versions[1]
	}
	return protoMinVersion, protoMaxVersion
}

// helloMsg encodes the hello of a connection of cfg on d with window
// credits and doorbell bell: the handshake's private data.
func helloMsg(d *device, cfg *Config, dialer bool, window uint32, bell *nic.MemoryRegion) []byte {
	lo, hi := configVersions(cfg)
	m := hello{minVer: lo, maxVer: hi, window: window, bufSize: uint32(cfg.BufferSize), maxTransfer: uint32(cfg.MaxTransfer)}
	if !cfg.NoRDMARead && d.nic.Attr().RDMARead {
		m.flags |= helloRead
	}
	if dialer {
		m.ringCap = uint32(d.key.ringCap)
	}
	var h header
	h.SetType(msgHello)
	h.SetLen(helloSize)
	h.SetAddr(uint64(bell.Addr))
	h.SetRKey(bell.RKey)
	msg := make([]byte, headerSize+helloSize)
	copy(msg, h[:])
	m.put(msg[headerSize:])
	return msg
}

// parseHelloMsg decodes and checks a hello message from the handshake,
// and returns its header, payload and decoded hello.
func parseHelloMsg(msg []byte) (header, []byte, hello, error) {
	h, payload, err := parseMessage(msg)
	switch {
	case err != nil:
		return h, nil, hello{}, fmt.Errorf("malformed hello: %v", err)
	case h.Type() != msgHello:
		return h, nil, hello{}, fmt.Errorf("the handshake carried %v, not hello", h.Type())
	case h.Ack() != 0:
		return h, nil, hello{}, fmt.Errorf("hello acknowledging %d messages never sent", h.Ack())
	}
	m, err := parseHello(&h, payload)
	return h, payload, m, err
}

// grantWindow bounds the acceptor's window by what the dialer's rings
// hold, ringCap bytes, of its bufSize-byte messages.
func grantWindow(window uint32, bufSize int, ringCap uint32) (uint32, error) {
	if ringCap < uint32(shm.MinRingCapacity) || ringCap > uint32(shm.MaxRingCapacity) {
		return 0, fmt.Errorf("hello ring capacity %d", ringCap)
	}
	fit := int(ringCap)/recordSize(bufSize) - 2
	if fit < minWindow {
		return 0, fmt.Errorf("the dialer's rings of %d bytes hold too few of our %d-byte messages", ringCap, bufSize)
	}
	return uint32(min(int(window), fit)), nil
}

// answerHello is the acceptor's part of the handshake
// (nic.QPOptions.Answer): it readies its hello's doorbell, checks the
// dialer's hello, and returns its own. A dialer whose hello is malformed,
// or whose rings are too small, is refused with the reason; one with no
// version in common gets our hello, and learns it from that (ErrVersion).
func answerHello(d *device, cfg *Config, bell **nic.MemoryRegion) func([]byte) ([]byte, error) {
	return func(req []byte) ([]byte, error) {
		if len(req) == 0 {
			return nil, fmt.Errorf("%w: a dialer without a session hello", ErrProtocol)
		}
		_, _, m, err := parseHelloMsg(req)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		window, err := grantWindow(uint32(cfg.Window), cfg.BufferSize, m.ringCap)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		if *bell, err = prepareHello(d); err != nil {
			return nil, err
		}
		return helloMsg(d, cfg, false, window, *bell), nil
	}
}

// newConn sets a connection up on a queue pair whose handshake carried
// both hellos: ours, naming bell, and the peer's, peerHello. On failure
// it releases everything, the device hold included.
func newConn(d *device, qp *nic.QueuePair, cq *nic.CompletionQueue, cfg Config, dialer bool, netw string, laddr, raddr net.Addr, bell *nic.MemoryRegion, peerHello []byte) (*Conn, error) {
	c := &Conn{
		cfg: cfg, dev: d, qp: qp, cq: cq, netw: netw, laddr: laddr, raddr: raddr,
		closing: make(chan struct{}), tornDown: make(chan struct{}),
		owner: nic.Owner(nextOwner.Add(1)),
	}
	c.lendMu.Init(lockrank.ConnLend)
	c.mu.init()
	c.rdl.init()
	c.wdl.init()
	c.stats.register()
	cq.SetWait(cfg.Wait) // the nic's waits are the connection's
	if cfg.Wait.Mode == shm.WaitBusyPoll {
		// We never sleep on the ring from the peer: its commits need no
		// fence (docs/performance.md, "Commits without a fence"). Without
		// membarrier(2) they keep it.
		_ = qp.SetSpinning()
	}
	c.dialer = dialer
	c.bufSize = cfg.BufferSize
	c.window = uint32(cfg.Window)
	c.peerWindow = 1
	c.offerRead = !cfg.NoRDMARead && d.nic.Attr().RDMARead
	c.maxInline = d.nic.Attr().MaxInline
	c.replyLook = cfg.Wait.Mode == shm.WaitBlock && cfg.ReplyWait > 0
	c.replySpin = shm.NewWaitStrategy(shm.WaitConfig{Mode: shm.WaitBusyPoll})
	c.bellMR = bell
	c.mu.Lock()
	c.takeHelloLocked(peerHello)
	err := c.err
	c.mu.Unlock()
	if err != nil {
		c.mu.Lock()
		c.tearing = true
		c.mu.Unlock()
		c.teardown()
		return nil, err
	}
	return c, nil
}

// takeHelloLocked applies the peer's hello from the handshake, as the
// first message on the rings once was.
func (c *Conn) takeHelloLocked(msg []byte) {
	if len(msg) > c.bufSize {
		c.abortLocked(protoErr("hello of %d bytes, larger than our %d-byte messages", len(msg), c.bufSize))
		return
	}
	h, payload, _, err := parseHelloMsg(msg)
	if err != nil {
		c.abortLocked(protoErr("%v", err))
		return
	}
	c.onHelloLocked(&h, payload)
}
