package sockets

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/pin"
	"github.com/sandirect/sandirect/shm"
)

// devKey is what makes two configurations need different nic devices.
type devKey struct {
	noRead     bool
	maxRegions int
	ringCap    int
	tempMemory int
	maxPinned  int64
}

// device is a nic device shared by the connections and listeners of one
// process whose configurations agree on devKey; it is closed when the last
// of them lets go. Temporary memory (device memory from nic.Alloc, which
// peers map, so RDMA on it is a plain copy) is pooled here.
type device struct {
	key devKey
	nic *nic.Device

	refs   int         // guarded by devices.mu
	idle   *time.Timer // closes the device deviceLinger after refs reached 0; guarded by devices.mu
	closed bool        // left devices.m for good; guarded by devices.mu

	mu        lockrank.Mutex // guards free, slabs, allocated; after Conn.mu
	free      [tempClasses][][]byte
	slabs     [][]byte
	allocated int

	pieces pieceCopier  // copies sources into temporary memory
	ctl    ctlPools     // control-message pools and the doorbell
	probed atomic.Int64 // when checkStaging last succeeded, in Unix ns (handshake.go)
}

// Temporary buffers come in power-of-two classes from 64 KiB.
const (
	tempMinShift = 16
	tempClasses  = 15 // up to 1 GiB
)

var devices struct {
	mu lockrank.Mutex // guards m and every device's refs
	m  map[devKey]*device
}

func init() { devices.mu.Init(lockrank.Devices) }

// deviceLinger is how long a device stays open once no connection or
// listener holds it: a process that dials per request, or a pool that
// reconnects, reuses it instead of paying for a new one (registration
// table, control pools, the registration monitor) each time.
var deviceLinger = time.Second

// devicesOpened counts the nic devices this process has opened: a dial
// that finds no listener of ours must open none.
var devicesOpened atomic.Uint64

func acquireDevice(cfg *Config) (*device, error) {
	key := devKey{
		noRead:     cfg.NoRDMARead,
		maxRegions: cfg.MaxRegions,
		ringCap:    ringCapacity(cfg.Window, cfg.BufferSize),
		tempMemory: cfg.TempMemory,
		maxPinned:  cfg.MaxPinnedBytes,
	}
	devices.mu.Lock()
	defer devices.mu.Unlock()
	if d := devices.m[key]; d != nil {
		d.holdLocked()
		return d, nil
	}
	nc := nic.DefaultConfig()
	nc.NoRDMARead = cfg.NoRDMARead
	nc.MaxRegions = cfg.MaxRegions
	nc.RingCapacity = key.ringCap
	// The switch spins itself when it wants to; the nic's waits block.
	nc.Wait = shm.WaitConfig{Mode: shm.WaitBlock}
	// RDMA runs in the goroutine that posts it, which would only wait
	// for the engine otherwise (the engine's goroutine hand-off costs
	// microseconds, and a core when the caller spins).
	nc.InlineExec = maxTransfer
	if key.maxPinned > 0 {
		pc := pin.DefaultConfig()
		pc.MaxPinnedBytes = key.maxPinned
		nc.Pin = &pc
	}
	nd, err := nic.Open(&nc)
	if err != nil {
		return nil, fmt.Errorf("sockets: open device: %w", err)
	}
	devicesOpened.Add(1)
	d := &device{key: key, nic: nd, refs: 1}
	d.mu.Init(lockrank.Device)
	d.ctl.mu.Init(lockrank.CtlPools)
	d.pieces.mu.Init(lockrank.PieceCopier)
	if devices.m == nil {
		devices.m = map[devKey]*device{}
	}
	devices.m[key] = d
	publishHold() // counters for tools/sdstat: publish.go
	return d, nil
}

// hold takes one more reference on d.
func (d *device) hold() {
	devices.mu.Lock()
	d.holdLocked()
	devices.mu.Unlock()
}

func (d *device) holdLocked() {
	d.refs++
	if d.idle != nil {
		d.idle.Stop() // a stale firing finds refs > 0 and does nothing
		d.idle = nil
	}
}

// tryHold takes one more reference on d unless it is closed or closing.
func (d *device) tryHold() bool {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	if d.closed {
		return false
	}
	d.holdLocked()
	return true
}

// release drops a reference; deviceLinger after the last one the device
// closes, unless it was taken again meanwhile.
func (d *device) release() {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	d.refs--
	if d.refs > 0 {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(deviceLinger, func() {
		devices.mu.Lock()
		if d.refs > 0 || d.idle != t || d.closed {
			devices.mu.Unlock()
			return
		}
		d.closed = true
		delete(devices.m, d.key)
		devices.mu.Unlock()
		d.close()
	})
	d.idle = t
}

// closeIdleDevices closes at once every device that no connection or
// listener holds, instead of after deviceLinger, and returns how many.
func closeIdleDevices() int {
	devices.mu.Lock()
	var idle []*device
	for k, d := range devices.m {
		if d.refs == 0 {
			d.idle.Stop()
			d.idle, d.closed = nil, true
			delete(devices.m, k)
			idle = append(idle, d)
		}
	}
	devices.mu.Unlock()
	for _, d := range idle {
		d.close()
	}
	return len(idle)
}

// close releases what the device holds; it has left devices.m.
func (d *device) close() {
	d.mu.Lock()
	for _, b := range d.slabs {
		d.nic.Free(b)
	}
	d.slabs, d.free = nil, [tempClasses][][]byte{}
	d.mu.Unlock()
	d.closePools()
	d.nic.Close()
	publishRelease()
}

func tempClass(n int) int {
	if n <= 1<<tempMinShift {
		return 0
	}
	return bits.Len(uint(n-1)) - tempMinShift
}

// slabSize is the smallest allocation from the nic: every Alloc is a
// segment that every connected peer maps, so temporary buffers are cut
// from slabs rather than allocated one by one.
const slabSize = 4 << 20

// getTemp returns a buffer of at least n bytes of device memory, or an
// error matching syscall.ENOBUFS when the budget is spent or the memory
// cannot be had. Buffers of a class are cut from slabs of at least
// slabSize bytes, which live as long as the device.
func (d *device) getTemp(n int) ([]byte, error) {
	c := tempClass(n)
	if c >= tempClasses {
		return nil, enobufs("temporary memory", fmt.Errorf("%d bytes is too large", n))
	}
	size := 1 << (tempMinShift + c)
	d.mu.Lock()
	defer d.mu.Unlock()
	if l := len(d.free[c]); l > 0 {
		b := d.free[c][l-1]
		d.free[c] = d.free[c][:l-1]
		return b, nil
	}
	slab := max(size, slabSize)
	if d.allocated+slab > d.key.tempMemory {
		slab = size // a smaller piece may still fit
		if d.allocated+slab > d.key.tempMemory {
			return nil, enobufs("temporary memory", fmt.Errorf("budget of %d bytes spent", d.key.tempMemory))
		}
	}
	mem, err := d.nic.Alloc(slab)
	if err != nil {
		return nil, enobufs("temporary memory", err)
	}
	d.allocated += slab
	d.slabs = append(d.slabs, mem)
	for off := size; off+size <= slab; off += size {
		d.free[c] = append(d.free[c], mem[off:off+size:off+size])
	}
	return mem[:size:size], nil
}

// putTemp gives back a buffer from getTemp.
func (d *device) putTemp(b []byte) {
	c := tempClass(len(b))
	d.mu.Lock()
	d.free[c] = append(d.free[c], b)
	d.mu.Unlock()
}

// dropTemp retires a buffer from getTemp that must never be reused: a
// peer may still write it. Its memory stays with its slab until the
// device closes.
func (d *device) dropTemp(b []byte) {}

// register registers buf with the nic; a full table is an ENOBUFS error.
func (d *device) register(owner nic.Owner, buf []byte, access nic.Access) (*nic.MemoryRegion, error) {
	mr, err := d.nic.RegisterFor(owner, buf, access)
	if errors.Is(err, syscall.ENOBUFS) {
		return nil, enobufs("register", err)
	}
	if err != nil {
		return nil, fmt.Errorf("sockets: register: %w", err)
	}
	return mr, nil
}
