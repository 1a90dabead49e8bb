package pin

import "sync/atomic"

// Hooks is what the NIC implements to take part in registration. pin knows
// nothing of keys: the NIC keeps them in Region.NIC.
//
// Every hook is called with the Cache's lock held, from the goroutine that
// called Register, Deregister, Invalidate, Flush or Close, or from the
// cache's invalidation goroutine: hooks must be quick, must not block on
// remote peers, and must not call back into the Cache.
type Hooks interface {
	// Register creates the NIC registration of a pinned region (local
	// keys). On error the registration fails with that error.
	Register(r *Region) error
	// Deregister removes the NIC registration of r; its pages are unlocked
	// afterwards, unless other registrations hold them.
	Deregister(r *Region)
	// Expose grants the peer access to r for the first time.
	Expose(r *Region, access Access) error
	// Revoke ends the peer's access to r: after it returns, no remote
	// operation may reach r's memory. If the NIC can do that only by
	// removing the registration, it removes it and returns dropped = true;
	// the cache keeps the pages locked and calls Register again before r is
	// used again. An error makes the cache drop the NIC registration too.
	Revoke(r *Region) (dropped bool, err error)
	// Reexpose grants the peer access again to a cached region that was
	// exposed before and revoked since.
	Reexpose(r *Region, access Access) error
}

// Region is a registration as the NIC sees it: the page-aligned range that
// is pinned, the access it was registered with, and a slot for the NIC.
// Several Handles may share a Region (all registrations of buffers inside
// it while it is cached).
type Region struct {
	Addr   uintptr // page aligned
	Len    uintptr // page multiple
	Access Access  // what the NIC registration allows
	// NIC belongs to the hooks: they set and read it under the cache's lock;
	// users of a Handle that read it concurrently synchronize through the
	// NIC's own means.
	NIC any
}

// entry is a registration: its Region plus the cache's bookkeeping. All
// fields but invalid are guarded by Cache.mu.
type entry struct {
	Region
	lo, hi      uintptr // == Addr, Addr+Len
	id          uint64
	refs        int32 // holders (Registers not yet Deregistered)
	remoteRefs  int32 // holders with remote access
	owner       Owner
	state       entryState
	registered  bool // the NIC registration exists
	exposed     bool // the peer may access it now
	everExposed bool
	holes       []span   // parts reported unmapped: their counts are dropped
	keep        [][]byte // the buffers whose objects must outlive the entry
	prev, next  *entry   // in Cache.lru (cached, unused) or Cache.others
	invalid     atomic.Bool
}

type entryState uint8

const (
	stateCached   entryState = iota // in the index; in lru when unused
	stateDead                       // out of the index, in use; released at the last Deregister
	stateUncached                   // never cacheable; released at the last Deregister
	stateReleased                   // unpinned
)

// list is an intrusive doubly linked list of entries with a sentinel.
type list struct{ root entry }

func (l *list) init()         { l.root.next, l.root.prev = &l.root, &l.root }
func (l *list) empty() bool   { return l.root.next == &l.root }
func (l *list) front() *entry { return l.root.next }
func (l *list) back() *entry  { return l.root.prev }

func (l *list) pushFront(e *entry) {
	e.prev, e.next = &l.root, l.root.next
	l.root.next.prev = e
	l.root.next = e
}

func (l *list) remove(e *entry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// Handle is one registration of a buffer, returned by Register and given
// back to Deregister exactly once. It is a small value: copying it is free,
// and a cache hit allocates nothing.
type Handle struct {
	e      *entry
	addr   uintptr
	n      int
	access Access
}

// Addr returns the address of the registered buffer.
func (h Handle) Addr() uintptr { return h.addr }

// Len returns the length of the registered buffer.
func (h Handle) Len() int { return h.n }

// Access returns the access this registration asked for.
func (h Handle) Access() Access { return h.access }

// Region returns the pinned, NIC-registered region containing the buffer;
// nil for the zero Handle.
func (h Handle) Region() *Region {
	if h.e == nil {
		return nil
	}
	return &h.e.Region
}

// Invalidated tells whether the region was invalidated (its memory was
// unmapped or changed) while this handle held it. The registration stays
// valid for the holder until Deregister, but remote access to it is revoked
// and the data in it is no longer the buffer's. Safe for concurrent use.
func (h Handle) Invalidated() bool { return h.e != nil && h.e.invalid.Load() }
