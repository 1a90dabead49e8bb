package sockets

import (
	"fmt"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/nic"
)

// A connection registers nothing of its own: its messages are written and
// read in place in the queue pair's rings (nic.QPOptions.InPlace), and the
// doorbell it announces in its hello is the device's one 8-byte region,
// registered at the first connection. (Connections once registered a pool
// of control buffers each, and a device's 4,096 regions capped a process
// at 1,365 connections.)

// ctlPools is the device's doorbell.
type ctlPools struct {
	mu     lockrank.Mutex // guards everything below
	bell   []byte
	bellMR *nic.MemoryRegion // nil until the first connection
	closed bool
}

// doorbell returns the device's doorbell region, registering it first.
func (d *device) doorbell() (*nic.MemoryRegion, error) {
	p := &d.ctl
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bellMR != nil {
		return p.bellMR, nil
	}
	if p.closed {
		return nil, fmt.Errorf("sockets: device closed")
	}
	p.bell = make([]byte, 8)
	mr, err := d.register(nic.NoOwner, p.bell, nic.AccessRemoteWrite)
	if err != nil {
		return nil, err
	}
	p.bellMR = mr
	return mr, nil
}

// ctlHeld returns the bytes of control memory the device holds
// registered: the doorbell's page.
func (d *device) ctlHeld() uint64 {
	p := &d.ctl
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bellMR != nil {
		return uint64(sys.PageSize)
	}
	return 0
}

// closePools releases the doorbell; the device's connections are all gone.
func (d *device) closePools() {
	p := &d.ctl
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.bellMR != nil {
		d.nic.Deregister(p.bellMR)
		p.bellMR, p.bell = nil, nil
	}
}
