package nic

import (
	"fmt"
	"syscall"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/pin"
	"github.com/sandirect/sandirect/shm"
)

// Access flags of a memory region.
type Access uint32

const (
	AccessLocalWrite  Access = 1 << iota // RDMA Read and receives may write it
	AccessRemoteRead                     // peers may RDMA Read it
	AccessRemoteWrite                    // peers may RDMA Write it
	// AccessStable promises that the memory stays mapped while it is
	// registered — memory of the Go heap (the region keeps it referenced)
	// or of Alloc, not an mmap the application may undo. The nic then
	// copies to and from it without the fault protection other memory
	// gets (docs/performance.md). Device memory is stable anyway.
	AccessStable
)

const remoteAccess = AccessRemoteRead | AccessRemoteWrite

// MemoryRegion is a registered buffer. Its fields do not change; after
// Deregister it must not be used.
type MemoryRegion struct {
	Addr   uintptr
	Len    int
	Access Access
	LKey   uint32 // names the region in local work requests
	RKey   uint64 // names it in peers' one-sided requests; 0 unless exposed

	buf    []byte     // keeps Go memory alive while registered
	h      pin.Handle // the pinned, cached registration underneath
	idx    int
	seg    uint32
	off    uint64
	stable bool // copies need no fault protection: device memory, or AccessStable
}

// Owner names whom a registration is made for — a connection, say — so
// that Flush can release what it left in the registration cache when it
// goes (a socket's cached registrations are released before it closes:
// docs/origins.md). NoOwner's registrations are shared and stay cached.
type Owner = pin.Owner

// NoOwner owns the registrations of Register and RegisterRemote.
const NoOwner = pin.NoOwner

// Buf returns the registered buffer.
func (mr *MemoryRegion) Buf() []byte { return mr.buf }

// Register registers buf for local access: as the source of sends and RDMA
// Writes, and with AccessLocalWrite as the target of receives and RDMA
// Reads (WSD's WSPRegisterMemory, docs/origins.md).
func (d *Device) Register(buf []byte, access Access) (*MemoryRegion, error) {
	if access&remoteAccess != 0 {
		return nil, fmt.Errorf("nic: Register with remote access: use RegisterRemote")
	}
	return d.register(NoOwner, buf, access)
}

// RegisterFor is Register or, with a remote access flag, RegisterRemote,
// on behalf of owner: the pinned pages stay cached after Deregister until
// Flush(owner), eviction or invalidation.
func (d *Device) RegisterFor(owner Owner, buf []byte, access Access) (*MemoryRegion, error) {
	return d.register(owner, buf, access)
}

// Flush releases the cached registrations of owner: unpinned now when no
// region uses them, at their last Deregister otherwise, and never handed
// out again. It returns how many it released. Call it when the owner's
// connection closes, after deregistering its regions.
func (d *Device) Flush(owner Owner) int {
	if d.cache == nil || owner == NoOwner {
		return 0
	}
	return d.cache.Flush(owner)
}

// Cached tells whether registering buf would find its pages pinned
// already (a cache hit: no system call). Without a registration cache
// (Config.NoPinning) nothing is pinned and it is always true.
func (d *Device) Cached(buf []byte) bool {
	if d.cache == nil {
		return len(buf) > 0
	}
	return d.cache.Cached(buf, 0)
}

// RegisterRemote registers buf and exposes it to peers with a fresh,
// unpredictable rkey (WSD's WSPRegisterRdmaMemory, docs/origins.md).
func (d *Device) RegisterRemote(buf []byte, access Access) (*MemoryRegion, error) {
	if access&remoteAccess == 0 {
		return nil, fmt.Errorf("nic: RegisterRemote without remote access")
	}
	return d.register(NoOwner, buf, access)
}

// Deregister releases a region from Register or RegisterRemote; a remote
// region's rkey stops working before Deregister returns (WSD's
// WSPDeregisterMemory and WSPDeregisterRdmaMemory, docs/origins.md).
func (d *Device) Deregister(mr *MemoryRegion) error {
	d.mu.Lock()
	if mr.idx < 0 || mr.idx >= len(d.regs) || d.regs[mr.idx].Load() != mr {
		d.mu.Unlock()
		return fmt.Errorf("%w: region not registered", ErrBadKey)
	}
	d.writeEntry(mr.idx, 0, 0, 0, 0, noSegment, 0) // revokes the rkey before anything else
	d.regs[mr.idx].Store(nil)
	d.free = append(d.free, mr.idx)
	if mr.Access&remoteAccess != 0 {
		d.forgetRemoteLocked(mr)
	}
	d.mu.Unlock()
	if d.cache != nil {
		// The pages stay pinned and cached for the next registration. Not
		// under d.mu: the cache calls our hooks, which take it.
		d.cache.Deregister(mr.h)
	}
	return nil
}

func (d *Device) register(owner Owner, buf []byte, access Access) (*MemoryRegion, error) {
	traceRegister(mem.Addr(buf), len(buf))
	if len(buf) == 0 {
		return nil, fmt.Errorf("nic: register of an empty buffer")
	}
	mr := &MemoryRegion{
		Addr:   mem.Addr(buf),
		Len:    len(buf),
		Access: access,
		buf:    buf,
		seg:    noSegment,
	}
	if ms := d.segmentOf(buf); ms != nil {
		mr.seg = ms.idx
		mr.off = uint64(mem.Offset(buf, ms.seg.Bytes()))
	}
	if d.cache != nil {
		// Pins the pages, or finds them pinned already (a cache hit makes
		// no system call). Fails with ENOBUFS past the pinning budget.
		// Remote access is the cache's to know: an invalidation of the
		// range while the region is in use revokes it at once (Revoke).
		h, err := d.cache.RegisterFor(owner, buf, pinAccess(access))
		if err != nil {
			return nil, fmt.Errorf("nic: register: %w", err)
		}
		mr.h = h
	}
	d.mu.Lock()
	if d.closed || len(d.free) == 0 && d.fresh == len(d.regs) {
		closed := d.closed
		d.mu.Unlock()
		if d.cache != nil {
			d.cache.Deregister(mr.h)
		}
		if closed {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("nic: registration table full (%d regions): %w", len(d.regs), syscall.ENOBUFS)
	}
	defer d.mu.Unlock()
	if mr.seg != noSegment && (d.memSegs[mr.seg] == nil || !mem.Within(buf, d.memSegs[mr.seg].buf)) {
		mr.seg, mr.off = noSegment, 0 // freed meanwhile: not device memory any more
	}
	mr.stable = mr.seg != noSegment || access&AccessStable != 0
	if n := len(d.free); n > 0 {
		mr.idx = d.free[n-1]
		d.free = d.free[:n-1]
	} else {
		// Indices are handed out lowest first; a list of them all,
		// built up front, cost every Open its copies and page faults
		// (docs/setup.md).
		mr.idx = d.fresh
		d.fresh++
	}
	mr.LKey = uint32(mr.idx) + 1
	if access&remoteAccess != 0 {
		mr.RKey = randomBits()<<rkeyIndexBits | uint64(mr.idx)
		if mr.RKey>>rkeyIndexBits == 0 {
			mr.RKey |= 1 << rkeyIndexBits // never 0
		}
	}
	d.regs[mr.idx].Store(mr)
	if r := mr.h.Region(); r != nil && access&remoteAccess != 0 {
		if d.remote == nil {
			d.remote = map[*pin.Region][]*MemoryRegion{}
		}
		d.remote[r] = append(d.remote[r], mr)
	}
	if mr.h.Invalidated() {
		// The memory changed between pinning and now: the invalidation's
		// revocation ran before this region was listed, so it is born
		// revoked (its holder still deregisters it).
		d.writeEntry(mr.idx, 0, 0, 0, 0, noSegment, 0)
		return mr, nil
	}
	d.writeEntry(mr.idx, mr.RKey, uint64(mr.Addr), uint64(mr.Len), uint32(access&remoteAccess), mr.seg, mr.off)
	traceRegistered(mr.Addr, mr.Len, mr.LKey, mr.RKey)
	return mr, nil
}

// writeEntry rewrites table entry i under its sequence lock. The caller
// holds d.mu, which serializes writers.
func (d *Device) writeEntry(i int, rkey, addr, length uint64, access, seg uint32, segOff uint64) {
	if d.closed {
		// The table is unmapped, or about to be, and no peer reads it:
		// a Deregister after Close (it still releases the pin) wrote
		// into the unmapped table and panicked.
		return
	}
	e := d.regSeg.Bytes()[regEntriesStart+i*entrySize : regEntriesStart+(i+1)*entrySize]
	s := shm.LoadUint64(e, entSeqOff)
	shm.StoreUint64(e, entSeqOff, s+1) // publishes: the entry is changing; readers retry
	shm.StoreUint64(e, entRKeyOff, rkey)
	shm.StoreUint64(e, entAddrOff, addr)
	shm.StoreUint64(e, entLenOff, length)
	shm.StoreUint32(e, entAccessOff, access)
	shm.StoreUint32(e, entSegOff, seg)
	shm.StoreUint64(e, entSegOffOff, segOff)
	shm.StoreUint64(e, entSeqOff, s+2) // publishes: the entry is stable again
}

// localRegion checks that buf lies inside the region named by lkey and that
// the region allows need, and returns it.
func (d *Device) localRegion(lkey uint32, buf []byte, need Access) (*MemoryRegion, error) {
	var mr *MemoryRegion
	if i := int(lkey) - 1; i >= 0 && i < len(d.regs) {
		mr = d.regs[i].Load()
	}
	if mr == nil {
		return nil, fmt.Errorf("%w: lkey %#x names no region", ErrBadKey, lkey)
	}
	if len(buf) > 0 && !mem.Within(buf, mr.buf) {
		return nil, fmt.Errorf("%w: buffer outside region of lkey %#x", ErrBadKey, lkey)
	}
	if mr.Access&need != need {
		return nil, fmt.Errorf("%w: region of lkey %#x lacks access %#x", ErrBadKey, lkey, need)
	}
	return mr, nil
}

// remoteEntry is a validated copy of a peer's registration table entry.
type remoteEntry struct {
	addr, length uint64
	access       uint32
	seg          uint32
	segOff       uint64
	seq          uint64
}

// peerTable is a peer's registration table, mapped read-only.
type peerTable struct {
	mem     []byte
	entries int
}

// lookup finds the live entry for rkey and checks that [addr, addr+n)
// lies in it and that it grants need. It never trusts a field it has not
// validated: the peer writes this memory.
func (t *peerTable) lookup(rkey, addr, n uint64, need Access) (remoteEntry, error) {
	idx := int(rkey & (maxRegEntries - 1))
	if rkey == 0 || idx >= t.entries {
		return remoteEntry{}, fmt.Errorf("rkey %#x out of table", rkey)
	}
	e := t.mem[regEntriesStart+idx*entrySize : regEntriesStart+(idx+1)*entrySize]
	for tries := 0; ; tries++ {
		s1 := shm.LoadUint64(e, entSeqOff)
		var r remoteEntry
		k := shm.LoadUint64(e, entRKeyOff)
		r.addr = shm.LoadUint64(e, entAddrOff)
		r.length = shm.LoadUint64(e, entLenOff)
		r.access = shm.LoadUint32(e, entAccessOff)
		r.seg = shm.LoadUint32(e, entSegOff)
		r.segOff = shm.LoadUint64(e, entSegOffOff)
		s2 := shm.LoadUint64(e, entSeqOff)
		if s1 != s2 || s1&1 != 0 {
			if tries > 1000 {
				return remoteEntry{}, fmt.Errorf("rkey %#x: entry never stable", rkey)
			}
			continue
		}
		r.seq = s1
		switch {
		case k != rkey:
			return remoteEntry{}, fmt.Errorf("rkey %#x revoked or never issued", rkey)
		case Access(r.access)&need != need:
			return remoteEntry{}, fmt.Errorf("rkey %#x lacks access %#x", rkey, need)
		case addr < r.addr || n > r.length || addr-r.addr > r.length-n:
			return remoteEntry{}, fmt.Errorf("rkey %#x: [%#x, +%d) outside region [%#x, +%d)", rkey, addr, n, r.addr, r.length)
		}
		return r, nil
	}
}

// stillLive tells whether the entry is unchanged since lookup.
func (t *peerTable) stillLive(rkey uint64, seq uint64) bool {
	idx := int(rkey & (maxRegEntries - 1))
	return shm.LoadUint64(t.mem, regEntriesStart+idx*entrySize+entSeqOff) == seq
}

// pinHooks connects the registration cache to the device. Keys live per
// MemoryRegion in the device's table, byte-exact, so registering,
// exposing and revoking a cached page range needs nothing from the NIC;
// what matters is the invalidation: when the cache drops a range because
// its mapping changed, every region inside it loses remote access at once.
type pinHooks struct{ d *Device }

func (pinHooks) Register(*pin.Region) error             { return nil }
func (pinHooks) Expose(*pin.Region, pin.Access) error   { return nil }
func (h pinHooks) Revoke(r *pin.Region) (bool, error)   { h.d.revokeRegion(r); return false, nil }
func (pinHooks) Reexpose(*pin.Region, pin.Access) error { return nil }
func (h pinHooks) Deregister(r *pin.Region)             { h.d.revokeRegion(r) }

// revokeRegion clears the table entries of the regions with remote access
// pinned through the cached range r: its memory changed or is going away.
// The regions stay allocated for their holders, whose peers' operations
// now fail. Regions pinned through another range — a newer entry for the
// same addresses, after a merge or a flush — keep their keys.
func (d *Device) revokeRegion(r *pin.Region) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, mr := range d.remote[r] {
		if d.regs[mr.idx].Load() == mr {
			d.writeEntry(mr.idx, 0, 0, 0, 0, noSegment, 0)
		}
	}
	delete(d.remote, r)
}

// forgetRemoteLocked drops mr from the remote regions of its range. The
// caller holds d.mu.
func (d *Device) forgetRemoteLocked(mr *MemoryRegion) {
	r := mr.h.Region()
	list := d.remote[r]
	for i, m := range list {
		if m == mr {
			list[i] = list[len(list)-1]
			list[len(list)-1] = nil
			list = list[:len(list)-1]
			break
		}
	}
	if len(list) == 0 {
		delete(d.remote, r)
	} else {
		d.remote[r] = list
	}
}

// pinAccess is the cache's view of a region's access: whether peers may
// reach it.
func pinAccess(a Access) pin.Access {
	var p pin.Access
	if a&AccessRemoteRead != 0 {
		p |= pin.AccessRemoteRead
	}
	if a&AccessRemoteWrite != 0 {
		p |= pin.AccessRemoteWrite
	}
	return p
}
