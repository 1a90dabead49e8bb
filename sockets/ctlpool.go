package sockets

import (
	"fmt"
	"sync"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/nic"
)

// The control-message pools of a device's connections are cut from slabs,
// each registered once, and every connection answers its peer's doorbell
// writes with the device's one doorbell. A connection registered its pool
// and its doorbell itself before: three regions a connection, so a process
// with the default 4,096 regions could hold 1,365 connections and no more,
// and every pool's lock split the Go heap's mappings. A slab is anonymous
// memory of its own (one mapping, locked whole), with room for 1, 2, then
// ctlSlabMax pools of one size: a process with one connection locks
// no more than before, one with thousands a region per ctlSlabMax of them.
//
// The memory is local: the slab's region has no remote access, so a peer
// can reach none of it (its key never leaves the process); the nic copies
// each message into and out of it. A pool goes back to its slab only once
// its queue pair is closed, when nothing can copy into it any more.

// ctlSlabMax is the most pools a slab holds. A slab is locked whole, so
// its free pools are memory held for connections yet to come, which
// weighed on idle connections with 16 (docs/performance.md); with 4, at
// most three pools a size wait, and a device's 4,096 regions still serve
// ~16,000 connections.
const ctlSlabMax = 4

type ctlSlab struct {
	mem   []byte
	mr    *nic.MemoryRegion
	owner nic.Owner // of the slab's cached registration, flushed with it
	free  []int     // indexes of free pools
	used  int
}

// ctlClass is the slabs of one pool size.
type ctlClass struct {
	slabs []*ctlSlab
	made  int // slabs made so far: the next holds min(1<<made, ctlSlabMax)
}

// ctlPool is a connection's share: its pool's memory and the slab's region.
type ctlPool struct {
	buf  []byte
	mr   *nic.MemoryRegion
	slab *ctlSlab
	size int
}

type ctlPools struct {
	mu      sync.Mutex // guards everything below
	classes map[int]*ctlClass
	bell    []byte            // the doorbell every peer may write; never read
	bellMR  *nic.MemoryRegion // nil until the first connection
	closed  bool
}

// getPool returns size bytes of registered, stable control memory.
func (d *device) getPool(size int) (ctlPool, error) {
	p := &d.ctl
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ctlPool{}, fmt.Errorf("sockets: device closed")
	}
	if p.classes == nil {
		p.classes = map[int]*ctlClass{}
	}
	cl := p.classes[size]
	if cl == nil {
		cl = &ctlClass{}
		p.classes[size] = cl
	}
	for _, s := range cl.slabs {
		if n := len(s.free); n > 0 {
			return s.take(size), nil
		}
	}
	n := min(1<<min(cl.made, 30), ctlSlabMax)
	s, err := d.newCtlSlab(size, n)
	if err != nil && n > 1 {
		s, err = d.newCtlSlab(size, 1) // a smaller slab may still fit the budget
	}
	if err != nil {
		return ctlPool{}, err
	}
	cl.made++
	cl.slabs = append(cl.slabs, s)
	return s.take(size), nil
}

func (d *device) newCtlSlab(size, n int) (*ctlSlab, error) {
	length := (size*n + sys.PageSize - 1) &^ (sys.PageSize - 1)
	mem, err := sys.MapAnon(length)
	if err != nil {
		return nil, enobufs("control memory", err)
	}
	// Stable: the slab stays mapped while it is registered, so the nic
	// copies messages to and from it without fault protection.
	owner := nic.Owner(nextOwner.Add(1))
	mr, err := d.register(owner, mem, nic.AccessLocalWrite|nic.AccessStable)
	if err != nil {
		sys.Munmap(mem)
		return nil, err
	}
	s := &ctlSlab{mem: mem, mr: mr, owner: owner}
	for i := n - 1; i >= 0; i-- {
		s.free = append(s.free, i)
	}
	return s, nil
}

func (s *ctlSlab) take(size int) ctlPool {
	i := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.used++
	buf := s.mem[i*size : (i+1)*size : (i+1)*size]
	clear(buf) // no message of an earlier connection shows through
	return ctlPool{buf: buf, mr: s.mr, slab: s, size: size}
}

// putPool gives back a pool from getPool; its queue pair is closed. A slab
// left empty is unmapped unless it is the last of its size (kept for the
// next connection).
func (d *device) putPool(cp ctlPool) {
	if cp.slab == nil {
		return
	}
	p := &d.ctl
	p.mu.Lock()
	defer p.mu.Unlock()
	s := cp.slab
	s.used--
	s.free = append(s.free, int((sys.Addr(cp.buf)-sys.Addr(s.mem))/uintptr(cp.size)))
	cl := p.classes[cp.size]
	if s.used > 0 || p.closed || cl == nil || len(cl.slabs) == 1 {
		return
	}
	for i, o := range cl.slabs {
		if o == s {
			cl.slabs = append(cl.slabs[:i], cl.slabs[i+1:]...)
			break
		}
	}
	s.release(d)
}

// release deregisters the slab, unpins it (the registration cache would
// keep it pinned, and it is about to be unmapped) and unmaps it.
func (s *ctlSlab) release(d *device) {
	d.nic.Deregister(s.mr)
	d.nic.Flush(s.owner)
	sys.Munmap(s.mem)
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

// ctlHeld returns the bytes of control memory the device holds registered:
// its slabs, used or kept, and the doorbell's page.
func (d *device) ctlHeld() uint64 {
	p := &d.ctl
	p.mu.Lock()
	defer p.mu.Unlock()
	var n uint64
	for _, cl := range p.classes {
		for _, s := range cl.slabs {
			n += uint64(len(s.mem))
		}
	}
	if p.bellMR != nil {
		n += uint64(sys.PageSize)
	}
	return n
}

// closePools releases every slab and the doorbell; the device's
// connections are all gone.
func (d *device) closePools() {
	p := &d.ctl
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, cl := range p.classes {
		for _, s := range cl.slabs {
			s.release(d)
		}
	}
	p.classes = nil
	if p.bellMR != nil {
		d.nic.Deregister(p.bellMR)
		p.bellMR, p.bell = nil, nil
	}
}
