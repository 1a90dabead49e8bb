package nic

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/quiesce"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/pin"
	"github.com/sandirect/sandirect/shm"
)

// Config configures a Device. A nil *Config means DefaultConfig(); a zero
// field means that field's default (DefaultConfig merged field by field).
type Config struct {
	// NoRDMARead turns RDMA Read off: the device then refuses RDMA Reads
	// it initiates; peers learn it at connect and pick the write
	// rendezvous.
	NoRDMARead bool
	// MaxInline is the largest send whose data is copied at post time;
	// negative: none.
	MaxInline int
	// MaxRegions bounds the registration table.
	MaxRegions int
	// RingCapacity is each direction's ring size on a queue pair; a send
	// carries at most RingCapacity/2-16 bytes.
	RingCapacity int
	// SendDepth and RecvDepth bound outstanding work requests per queue pair.
	SendDepth, RecvDepth int
	// InlineExec is how many bytes of an RDMA operation the posting
	// goroutine moves itself when nothing is queued ahead of it; the rest
	// is left to the engine and to pollers of the send CQ. Negative: none.
	InlineExec int
	// Chunk is how many bytes the engine moves for one work request
	// before it turns to the next queue pair. Default 1 MiB: Go's copy
	// streams a move of 1 MiB or more past the caches (non-temporal
	// stores), much faster for data that is not read right away
	// (docs/performance.md, "Engine chunk").
	Chunk int
	// RNRTimeout bounds how long a send waits for room in the peer's ring.
	RNRTimeout time.Duration
	// Wait configures how completion queues wait.
	Wait shm.WaitConfig
	// AllowUIDs lists peer uids allowed besides our own.
	AllowUIDs []uint32
	// Pin configures the registration cache that pins registered memory
	// (nil: pin.DefaultConfig; its Hooks are the device's own).
	Pin *pin.Config
	// NoPinning registers memory without locking it: for processes that
	// may not lock memory at all. Registrations are then not cached.
	NoPinning bool
}

// DefaultConfig returns the defaults: RDMA Read supported, 256 B inline,
// 4096 regions, 256 KiB rings (128 KiB largest send), 1 MiB moved at
// post time, 1 MiB chunks, 1 s RNR timeout, adaptive waiting.
func DefaultConfig() Config {
	return Config{
		MaxInline:    256,
		MaxRegions:   4096,
		RingCapacity: 256 << 10,
		SendDepth:    1024,
		RecvDepth:    1024,
		InlineExec:   1 << 20,
		Chunk:        1 << 20,
		RNRTimeout:   time.Second,
		Wait:         shm.DefaultWaitConfig(),
	}
}

// withDefaults fills zero fields with their defaults, and turns the
// negative "none" of MaxInline and InlineExec into 0.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	set := func(v *int, def int) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			*v = 0
		}
	}
	set(&c.MaxInline, d.MaxInline)
	set(&c.MaxRegions, d.MaxRegions)
	set(&c.RingCapacity, d.RingCapacity)
	set(&c.SendDepth, d.SendDepth)
	set(&c.RecvDepth, d.RecvDepth)
	set(&c.InlineExec, d.InlineExec)
	set(&c.Chunk, d.Chunk)
	if c.RNRTimeout == 0 {
		c.RNRTimeout = d.RNRTimeout
	}
	if c.Wait == (shm.WaitConfig{}) {
		c.Wait = d.Wait
	}
	if c.Wait.Mode == shm.WaitAdaptive && c.Wait.Spin == 0 {
		c.Wait.Spin = shm.DefaultSpin
	}
	return c
}

// Validate reports a configuration that cannot work. Zero fields are
// taken as their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.MaxInline < 0 || c.MaxInline > c.RingCapacity/2-16:
		return fmt.Errorf("nic: MaxInline %d outside [0, %d]", c.MaxInline, c.RingCapacity/2-16)
	case c.MaxRegions < 1 || c.MaxRegions > maxRegEntries:
		return fmt.Errorf("nic: MaxRegions %d outside [1, %d]", c.MaxRegions, maxRegEntries)
	case c.RingCapacity < shm.MinRingCapacity || c.RingCapacity > shm.MaxRingCapacity || c.RingCapacity&(c.RingCapacity-1) != 0:
		return fmt.Errorf("nic: RingCapacity %d is not a power of two in [%d, %d]", c.RingCapacity, shm.MinRingCapacity, shm.MaxRingCapacity)
	case c.SendDepth < 1 || c.RecvDepth < 1:
		return fmt.Errorf("nic: queue depths must be positive")
	case c.InlineExec < 0 || c.Chunk < 4096:
		return fmt.Errorf("nic: InlineExec must be ≥ 0 and Chunk ≥ 4096")
	case c.RNRTimeout <= 0:
		return fmt.Errorf("nic: RNRTimeout must be positive")
	}
	return c.Wait.Validate()
}

// Attr describes a device, as its peers learn it at connect.
type Attr struct {
	RDMARead   bool
	MaxInline  int
	MaxRegions int
	MaxSend    int // largest send payload
}

// Device is this process's emulated NIC. It is safe for concurrent use.
type Device struct {
	cfg  Config
	attr Attr

	regSeg *shm.Segment // registration table, shared read-only with peers
	cache  *pin.Cache   // pins registered memory; nil with NoPinning
	hub    *shm.Hub     // how peers wake our waiting goroutines; shared with them

	// earlyOut counts early dials whose reply has not come yet (known.go).
	earlyOut atomic.Int32
	// qpKept counts the queue-pair segments whose fds the dialer keeps for
	// reuse, live and pooled (qppool.go).
	qpKept atomic.Int32

	mu    lockrank.Mutex                 // guards regs, free, fresh, memSegs, qps, closed; before QP and CQ locks
	regs  []atomic.Pointer[MemoryRegion] // by table index; read without mu
	free  []int                          // table indices released, reused first
	fresh int                            // table indices from fresh on were never used
	// remote lists the regions with remote access pinned through each
	// cached range, so that an invalidation revokes exactly those.
	remote  map[*pin.Region][]*MemoryRegion
	memSegs map[uint32]*memSegment
	nextSeg uint32
	qps     map[*QueuePair]struct{}
	closed  bool

	eng *engine

	retired Stats // counters of closed queue pairs; guarded by mu

	// This device's registration table and hub table as files, for the
	// held files a dialer's hello names (ownFiles).
	ownOnce          sync.Once
	ownTable, ownHub shm.FileID

	parked parkedImports           // peers' mappings kept for the next queue pairs; guarded by imports.mu
	known  map[knownKey]*knownPeer // listeners' answers for early dials (known.go); guarded by imports.mu
}

type memSegment struct {
	idx uint32
	seg *shm.Segment
	buf []byte
	uid uint32 // only peers of this uid map it

	// freed is set by Free before it retracts the segment from queue
	// pairs: an announcement that comes later is not sent.
	freed atomic.Bool
}

// Stats counts the work of a queue pair, or of a whole device (the sum
// over its queue pairs, closed ones included).
type Stats struct {
	Sends, Recvs, Writes, Reads uint64
	BytesSent, BytesReceived    uint64
	BytesWritten, BytesRead     uint64
	Errors, RNRRetries          uint64
	InlineExecs, EngineExecs    uint64 // send-queue work run by the poster, by the engine
	// Chunks of queued send-queue work run by pollers of the send CQ, and
	// by the engine goroutine (the fallback while nobody polls).
	PolledChunks, EngineChunks uint64
	// Queue pairs of the dialer made on the segment of an earlier one
	// (qppool.go).
	SegmentsReused uint64
	// Early dials whose listener replied without fds: it took the
	// registration table and hub the hello named as its own (cmFlagHeld).
	HeldReplies uint64
}

func (s *Stats) add(o *Stats) {
	s.Sends += o.Sends
	s.Recvs += o.Recvs
	s.Writes += o.Writes
	s.Reads += o.Reads
	s.BytesSent += o.BytesSent
	s.BytesReceived += o.BytesReceived
	s.BytesWritten += o.BytesWritten
	s.BytesRead += o.BytesRead
	s.Errors += o.Errors
	s.RNRRetries += o.RNRRetries
	s.InlineExecs += o.InlineExecs
	s.EngineExecs += o.EngineExecs
	s.PolledChunks += o.PolledChunks
	s.EngineChunks += o.EngineChunks
	s.SegmentsReused += o.SegmentsReused
	s.HeldReplies += o.HeldReplies
}

// Open creates a device.
func Open(cfg *Config) (*Device, error) {
	c := DefaultConfig()
	if cfg != nil {
		c = cfg.withDefaults()
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	// The rings' fence-free ways need this process registered for global
	// memory barriers, which takes milliseconds: begun here, in the
	// background, so that a listener's first accept and a dialer's first
	// connection need not wait for it (shm.NewProducer).
	sys.MembarrierStart()
	// Peers get the fd: they may map it for reading only.
	seg, err := shm.CreateReadOnlySegment("regtable", kindRegTable, regTableSize(c.MaxRegions))
	if err != nil {
		return nil, fmt.Errorf("nic: registration table: %w", err)
	}
	mem := seg.Bytes()
	binary.LittleEndian.PutUint32(mem[regMagicOff:], regMagic)
	binary.LittleEndian.PutUint32(mem[regVersionOff:], regVersion)
	binary.LittleEndian.PutUint32(mem[regEntriesOff:], uint32(c.MaxRegions))
	binary.LittleEndian.PutUint32(mem[regEntrySizeOff:], entrySize)
	d := &Device{
		cfg: c,
		attr: Attr{
			RDMARead:   !c.NoRDMARead,
			MaxInline:  c.MaxInline,
			MaxRegions: c.MaxRegions,
			MaxSend:    c.RingCapacity/2 - 16,
		},
		regSeg:  seg,
		regs:    make([]atomic.Pointer[MemoryRegion], c.MaxRegions),
		memSegs: map[uint32]*memSegment{},
		qps:     map[*QueuePair]struct{}{},
	}
	d.mu.Init(lockrank.NICDevice)
	if d.hub, err = shm.NewHub(); err != nil {
		seg.Close()
		return nil, fmt.Errorf("nic: %w", err)
	}
	if !c.NoPinning {
		pc := pin.DefaultConfig()
		if c.Pin != nil {
			pc = *c.Pin
		}
		pc.Hooks = pinHooks{d}
		if d.cache, err = pin.New(&pc); err != nil {
			seg.Close()
			d.hub.Close()
			return nil, fmt.Errorf("nic: registration cache: %w", err)
		}
	}
	d.eng = newEngine(d)
	d.publishStats() // counters for tools/sdstat: nic/stats.go
	return d, nil
}

// Attr returns the device's attributes.
func (d *Device) Attr() Attr { return d.attr }

// Config returns the device's configuration, defaults filled in.
func (d *Device) Config() Config { return d.cfg }

// Cache returns the registration cache (nil with NoPinning).
func (d *Device) Cache() *pin.Cache { return d.cache }

// Stats returns the device's counters: the sum over its queue pairs.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	st := d.retired
	qps := make([]*QueuePair, 0, len(d.qps))
	for qp := range d.qps {
		qps = append(qps, qp)
	}
	d.mu.Unlock()
	for _, qp := range qps {
		s := qp.Stats()
		st.add(&s)
	}
	return st
}

// Close closes every queue pair of the device, stops its engine and releases
// its memory. Buffers from Alloc must not be used afterwards.
func (d *Device) Close() error {
	d.unpublishStats() // before any lock: it waits for a running snapshot
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	qps := make([]*QueuePair, 0, len(d.qps))
	for qp := range d.qps {
		qps = append(qps, qp)
	}
	d.mu.Unlock()
	for _, qp := range qps {
		qp.Close()
	}
	d.closeParked()
	d.eng.stop()
	if d.cache != nil {
		d.cache.Close()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ms := range d.memSegs {
		ms.seg.Close()
	}
	d.memSegs = nil
	d.hub.Close()
	return d.regSeg.Close()
}

// Alloc returns n bytes of device memory: a page-aligned buffer in a shared
// segment that every connected peer maps, so RDMA on it is a plain copy
// (the fast path). Free it with Free.
func (d *Device) Alloc(n int) ([]byte, error) {
	return d.AllocFor(n, uint32(os.Getuid()))
}

// AllocFor is Alloc for memory that peers of uid map, and no other: a
// peer maps device memory whole and reads and writes it as it likes (the
// registration checks run in the peer), so memory that a peer of another
// uid, admitted by Config.AllowUIDs, may reach must be memory that only
// such peers share. Alloc's memory is for peers of our own uid, which
// could ptrace us anyway. To a peer of any other uid, RDMA on the memory
// fails with StatusRemoteAccess.
func (d *Device) AllocFor(n int, uid uint32) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("nic: Alloc of %d bytes", n)
	}
	seg, err := shm.CreateSegment("mem", kindMemory, memDataOff+n)
	if err != nil {
		return nil, err
	}
	buf := seg.Bytes()[memDataOff : memDataOff+n : memDataOff+n]
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		seg.Close()
		return nil, ErrClosed
	}
	ms := &memSegment{idx: d.nextSeg, seg: seg, buf: buf, uid: uid}
	d.nextSeg++
	d.memSegs[ms.idx] = ms
	qps := make([]*QueuePair, 0, len(d.qps))
	for qp := range d.qps {
		qps = append(qps, qp)
	}
	d.mu.Unlock()
	for _, qp := range qps {
		qp.announceSegment(ms)
	}
	return buf, nil
}

// Free releases device memory from Alloc. Regions registered on it must be
// deregistered first: Free refuses otherwise.
func (d *Device) Free(buf []byte) error {
	ms := d.segmentOf(buf)
	if ms == nil || mem.Addr(ms.buf) != mem.Addr(buf) {
		return fmt.Errorf("nic: Free of memory not from Alloc")
	}
	d.mu.Lock()
	if d.memSegs[ms.idx] != ms {
		d.mu.Unlock()
		return fmt.Errorf("nic: Free of memory not from Alloc")
	}
	for i := range d.regs {
		if mr := d.regs[i].Load(); mr != nil && mr.seg == ms.idx {
			d.mu.Unlock()
			return fmt.Errorf("nic: Free of device memory that region lkey %#x still uses: deregister it first", mr.LKey)
		}
	}
	ms.freed.Store(true)
	delete(d.memSegs, ms.idx)
	qps := make([]*QueuePair, 0, len(d.qps))
	for qp := range d.qps {
		qps = append(qps, qp)
	}
	d.mu.Unlock()
	// A copy that found a region here live (owns) is done before its
	// queue pair's lock is free: wait for those, then unmap.
	for _, qp := range qps {
		quiesce.Wait(&qp.sqMu, &qp.rqMu)
	}
	// Peers unmap the segment when its SEG_DEL reaches them (version 2);
	// until then their copies land in pages nobody else reads, never in
	// our address space.
	for _, qp := range qps {
		qp.retractSegment(ms.idx)
	}
	return ms.seg.Close()
}

// devMem tells whether buf lies in the live region lkey, and that region
// is stable (see owns): copies from it need no fault protection.
func (d *Device) devMem(lkey uint32, buf []byte) bool {
	i := int(lkey) - 1
	if i < 0 || i >= len(d.regs) {
		return false
	}
	mr := d.regs[i].Load()
	return mr != nil && mr.stable && mem.Within(buf, mr.buf)
}

// owns tells whether mr is a live region in stable memory: device memory,
// which is unmapped only by Free, which refuses while a region uses it and
// then waits out every queue pair's locks, or by Close, once every queue
// pair is closed; or memory registered with AccessStable, which its owner
// keeps mapped while registered. A copy to or from it under a queue
// pair's lock cannot fault, and needs none of safeCopy's protection
// (docs/performance.md, "Fault protection").
func (d *Device) owns(mr *MemoryRegion) bool {
	return mr != nil && mr.stable && d.regs[mr.idx].Load() == mr
}

// DeviceMemory tells whether buf lies within one buffer from Alloc.
func (d *Device) DeviceMemory(buf []byte) bool { return d.segmentOf(buf) != nil }

// segmentOf returns the memory segment that holds all of buf, or nil.
func (d *Device) segmentOf(buf []byte) *memSegment {
	if len(buf) == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ms := range d.memSegs {
		if mem.Within(buf, ms.buf) {
			return ms
		}
	}
	return nil
}

func randomBits() uint64 {
	var b [8]byte
	rand.Read(b[:]) // never fails (getrandom); documented since Go 1.24
	return binary.LittleEndian.Uint64(b[:])
}
