package pin

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
)

// Cache pins and registers buffers and caches the registrations. Safe for
// concurrent use by any number of goroutines.
type Cache struct {
	cfg    Config
	hooks  Hooks
	mon    monitor
	report MonitorReport
	epoch  *atomic.Uint64 // the monitor's published epoch: the fast-path check
	ctr    counters
	done   chan struct{} // closed by Close: stops the drain goroutine
	wg     sync.WaitGroup
	// monReady is closed when the monitor is chosen: at once for a kind
	// named in the Config, after the background start for MonitorAuto
	// (startAuto). mon, epoch and report change until then, under mu.
	monReady chan struct{}
	// autoWaits: MonitorAuto's start waits for the first registration of
	// foreign memory, or a call to Monitor (beginAutoLocked). Guarded by
	// mu.
	autoWaits bool

	// mu guards every field below and every entry's fields (but invalid).
	// Lock order: mu (lockrank.PinCache), then owned.mu (read). Hooks run under mu. No goroutine
	// unmaps memory while holding mu, so a monitor that blocks unmapping
	// threads never waits for it.
	mu       lockrank.Mutex
	closed   bool
	applied  uint64 // the last monitor epoch applied to the index
	idx      index
	lru      list // cached, unused entries; front = most recently used
	others   list // dead or uncached entries, in use
	pins     pinTable
	nEntries int
	nextID   uint64
	scratch  []*entry
}

// New creates a cache with cfg (nil: DefaultConfig) and starts its monitor.
func New(cfg *Config) (*Cache, error) {
	var c0 Config
	if cfg != nil {
		c0 = *cfg
	}
	if err := c0.Validate(); err != nil {
		return nil, err
	}
	c0 = c0.withDefaults()
	c := &Cache{cfg: c0, hooks: c0.Hooks, done: make(chan struct{})}
	c.mu.Init(lockrank.PinCache)
	c.lru.init()
	c.others.init()
	c.pins.unwatch = c.unwatchFree
	c.monReady = make(chan struct{})
	if m, rep, ok := c0.adoptIdle(); ok {
		// The monitor a closed cache left (idle.go): nothing to load.
		c.mu.Lock()
		c.adoptLocked(m, rep)
		c.mu.Unlock()
		close(c.monReady)
	} else if c0.Monitor == MonitorAuto {
		c.startAuto()
	} else {
		m, rep, err := startMonitor(c0.Monitor, c0.MaxBacklog)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.adoptLocked(m, rep)
		c.mu.Unlock()
		close(c.monReady)
	}
	registerCache(c)
	return c, nil
}

// Monitor tells which monitor watches foreign memory and why the better
// ones do not. With MonitorAuto it waits for the monitor's background
// start to finish (see startAuto); CurrentMonitor does not.
func (c *Cache) Monitor() MonitorReport {
	c.mu.Lock()
	c.beginAutoLocked()
	c.mu.Unlock()
	<-c.monReady
	return c.CurrentMonitor()
}

// CurrentMonitor is Monitor without the wait: while MonitorAuto's monitor
// is starting it reports MonitorOwned with Starting set.
func (c *Cache) CurrentMonitor() MonitorReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.report
}

// Config returns the configuration in force, defaults filled in.
func (c *Cache) Config() Config { return c.cfg }

// Register is RegisterFor(NoOwner, buf, access).
func (c *Cache) Register(buf []byte, access Access) (Handle, error) {
	return c.RegisterFor(NoOwner, buf, access)
}

// Cached tells whether registering buf with access would be a hit: a
// cached registration covers it, so RegisterFor would make no system call.
// It pins and counts nothing. Safe for concurrent use.
func (c *Cache) Cached(buf []byte, access Access) bool {
	if len(buf) == 0 {
		return false
	}
	access &= accessAll
	addr := sys.Addr(buf)
	end := addr + uintptr(len(buf))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	if c.epoch.Load() != c.applied {
		c.drainLocked()
	}
	return c.hitLocked(addr, end, access) != nil
}

// hitLocked returns the cached entry that covers [addr, end) with at least
// access, or nil. The caller holds mu and has drained the monitor.
func (c *Cache) hitLocked(addr, end uintptr, access Access) *entry {
	if i := c.idx.floor(addr); i >= 0 {
		if e := c.idx.ents[i]; end <= e.hi && access&^e.Access == 0 {
			return e
		}
	}
	return nil
}

// RegisterFor pins buf (the page-aligned superset of it), registers it with
// the NIC and, for remote access, exposes it, on behalf of owner. A cached
// registration covering buf with at least the access asked for is reused: no
// system call, no allocation. The Handle must be given to Deregister once.
//
// The cache holds buf (so its object stays alive, and the Go GC cannot reuse
// the address) for as long as the registration is cached. buf must not be on
// a stack (ErrStack); a []byte passed here escapes to the heap anyway.
//
// When the pages cannot be pinned (mlock fails for lack of memory, or the
// limits are reached) unused entries are evicted and pinning tried once
// more; then the error matches syscall.ENOBUFS.
func (c *Cache) RegisterFor(owner Owner, buf []byte, access Access) (Handle, error) {
	n := len(buf)
	if n == 0 {
		c.ctr.failures.Add(1)
		return Handle{}, ErrEmpty
	}
	access &= accessAll
	addr := sys.Addr(buf)
	end := addr + uintptr(n)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.ctr.failures.Add(1)
		return Handle{}, ErrClosed
	}
	if c.epoch.Load() != c.applied {
		c.drainLocked()
	}
	if e := c.hitLocked(addr, end, access); e != nil {
		traceHit(addr, n, e.lo, e.hi)
		err := c.acquireLocked(e, owner, access)
		c.mu.Unlock()
		if err != nil {
			c.ctr.failures.Add(1)
			return Handle{}, err
		}
		c.ctr.hits.Add(1)
		return Handle{e: e, addr: addr, n: n, access: access}, nil
	}
	traceMiss(addr, n)
	e, err := c.missLocked(owner, buf, addr, end, access)
	c.mu.Unlock()
	if err != nil {
		c.ctr.failures.Add(1)
		return Handle{}, err
	}
	c.ctr.misses.Add(1)
	return Handle{e: e, addr: addr, n: n, access: access}, nil
}

// acquireLocked takes one more hold on a cached entry for owner.
func (c *Cache) acquireLocked(e *entry, owner Owner, access Access) error {
	if !e.registered && c.hooks != nil {
		if err := c.hooks.Register(&e.Region); err != nil {
			return fmt.Errorf("nic register: %w", err)
		}
		e.registered = true
	}
	if access.Remote() && e.remoteRefs == 0 {
		if err := c.exposeLocked(e); err != nil {
			return err
		}
	}
	if e.refs == 0 && e.state == stateCached {
		c.lru.remove(e)
	}
	e.refs++
	if access.Remote() {
		e.remoteRefs++
	}
	e.owner = owner
	return nil
}

func (c *Cache) exposeLocked(e *entry) error {
	if c.hooks == nil || e.exposed {
		e.exposed = true
		return nil
	}
	var err error
	if e.everExposed {
		err = c.hooks.Reexpose(&e.Region, e.Access)
	} else {
		err = c.hooks.Expose(&e.Region, e.Access)
	}
	if err != nil {
		return fmt.Errorf("nic expose: %w", err)
	}
	e.exposed, e.everExposed = true, true
	return nil
}

// revokeLocked ends remote access to e.
func (c *Cache) revokeLocked(e *entry) error {
	if !e.exposed {
		return nil
	}
	e.exposed = false
	if c.hooks == nil || !e.registered {
		return nil
	}
	dropped, err := c.hooks.Revoke(&e.Region)
	if err != nil {
		// Access must end: take the registration away altogether.
		c.hooks.Deregister(&e.Region)
		e.registered = false
		return fmt.Errorf("nic revoke: %w", err)
	}
	if dropped {
		e.registered = false
	}
	return nil
}

// missLocked creates an entry for [addr, end), merging the cached entries it
// overlaps.
func (c *Cache) missLocked(owner Owner, buf []byte, addr, end uintptr, access Access) (*entry, error) {
	if end < addr {
		return nil, fmt.Errorf("buffer wraps the address space")
	}
	if onStack(addr, end) {
		return nil, ErrStack
	}
	req := pageSpan(addr, end-addr)
	s := req
	cacheable := c.cacheableLocked(req)
	var olds []*entry
	if cacheable {
		s, access, olds = c.takeOverlapsLocked(s, access)
	}
	unused := 0
	for _, o := range olds {
		if o.refs == 0 {
			unused++
		}
	}
	if err := c.pinLocked(s, unused); err != nil {
		c.restoreLocked(req, olds, cacheable)
		return nil, err
	}
	e := c.newEntryLocked(owner, buf, s, access, olds)
	if err := c.registerNewLocked(e); err != nil {
		c.restoreLocked(req, olds, cacheable)
		c.pins.unpin(s, nil)
		return nil, err
	}
	if cacheable && !c.watchMergedLocked(span{e.lo, e.hi}) {
		cacheable = false
	}
	c.installLocked(e, olds, cacheable)
	return e, nil
}

// takeOverlapsLocked takes the cached entries that s overlaps out of the
// index, and returns them with the union of their ranges and s and of
// their access and access: the new entry covers their union, so the index
// stays non-overlapping. Pages they share stay pinned throughout: the new
// entry pins before the old ones unpin.
func (c *Cache) takeOverlapsLocked(s span, access Access) (span, Access, []*entry) {
	olds := c.scratch[:0]
	i, j := c.idx.overlapping(s.lo, s.hi)
	for _, o := range c.idx.ents[i:j] {
		s.lo, s.hi = min(s.lo, o.lo), max(s.hi, o.hi)
		access |= o.Access
		if o.refs == 0 {
			c.lru.remove(o)
		}
		olds = append(olds, o)
	}
	c.idx.removeAt(i, j)
	c.scratch = olds[:0]
	return s, access, olds
}

// restoreLocked undoes a miss for req that failed: it stops watching the
// pages of req that nothing pins (cacheableLocked began to), and puts the
// entries of takeOverlapsLocked back.
func (c *Cache) restoreLocked(req span, olds []*entry, cacheable bool) {
	// The entries go back before the pages are unwatched: a granule they
	// lie in must stay watched (unwatchFree).
	for _, o := range olds {
		c.idx.insert(o)
		if o.refs == 0 {
			c.lru.pushFront(o)
		}
	}
	if cacheable {
		for _, g := range c.pins.unpinned(req) {
			c.unwatchFree(g.lo, g.len())
		}
	}
}

// newEntryLocked makes the entry for the pinned span s, held once by
// owner. It keeps buf alive, and what the entries it merges kept.
func (c *Cache) newEntryLocked(owner Owner, buf []byte, s span, access Access, olds []*entry) *entry {
	c.nextID++
	e := &entry{
		Region: Region{Addr: s.lo, Len: s.len(), Access: access},
		lo:     s.lo, hi: s.hi, id: c.nextID, owner: owner, refs: 1,
	}
	if access.Remote() {
		e.remoteRefs = 1
	}
	for _, o := range olds {
		e.keep = append(e.keep, o.keep...)
	}
	e.keep = append(e.keep, buf[:len(buf):len(buf)])
	return e
}

// registerNewLocked registers a new entry with the NIC and, for remote
// access, exposes it. When it fails, the NIC keeps nothing of the entry.
func (c *Cache) registerNewLocked(e *entry) error {
	remote := e.Access.Remote()
	if c.hooks == nil {
		e.exposed, e.everExposed = remote, remote
		return nil
	}
	if err := c.hooks.Register(&e.Region); err != nil {
		return fmt.Errorf("nic register: %w", err)
	}
	e.registered = true
	if remote {
		if err := c.exposeLocked(e); err != nil {
			c.hooks.Deregister(&e.Region)
			return err
		}
	}
	return nil
}

// installLocked enters a new, registered entry in the index (or, when its
// range cannot be cached, in the list of entries in use), and releases the
// entries it merged — or, for those in use, marks them dead: their holders
// keep them until their last Deregister.
func (c *Cache) installLocked(e *entry, olds []*entry, cacheable bool) {
	c.nEntries++
	if cacheable && !c.watchMergedLocked(span{e.lo, e.hi}) {
		cacheable = false
	}
	if cacheable {
		e.state = stateCached
		c.idx.insert(e)
	} else {
		e.state = stateUncached
		c.others.pushFront(e)
	}
	for _, o := range olds {
		if o.refs == 0 {
			c.releaseLocked(o)
		} else {
			o.state = stateDead
			c.others.pushFront(o)
		}
	}
	c.syncCounters()
}

// pinLocked pins s within the limits, evicting unused entries to make room,
// and retrying once after evicting everything unused if mlock fails for lack
// of memory. merged entries are about to be released in favour of the new
// one.
func (c *Cache) pinLocked(s span, merged int) error {
	for c.nEntries+1-merged > c.cfg.MaxEntries {
		if !c.evictOneLocked() {
			return fmt.Errorf("pin %d bytes: %w: %d registrations alive, limit %d",
				s.len(), syscall.ENOBUFS, c.nEntries, c.cfg.MaxEntries)
		}
	}
	for {
		need := c.pins.unpinnedBytes(s)
		if int64(c.pins.bytes+need) <= c.cfg.MaxPinnedBytes {
			break
		}
		if !c.evictOneLocked() {
			return fmt.Errorf("pin %d bytes: %w: %d bytes pinned, limit %d",
				s.len(), syscall.ENOBUFS, c.pins.bytes, c.cfg.MaxPinnedBytes)
		}
	}
	err := c.pins.pin(s)
	if err != nil && (errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EAGAIN)) {
		for c.evictOneLocked() {
		}
		err = c.pins.pin(s)
	}
	if err != nil {
		if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EAGAIN) {
			return fmt.Errorf("mlock %d bytes: %w (%w)", s.len(), syscall.ENOBUFS, err)
		}
		return fmt.Errorf("mlock %d bytes: %w", s.len(), err)
	}
	return nil
}

// evictOneLocked releases the least recently used unused entry.
func (c *Cache) evictOneLocked() bool {
	if c.lru.empty() {
		return false
	}
	e := c.lru.back()
	c.lru.remove(e)
	c.idx.remove(e)
	c.releaseLocked(e)
	c.ctr.evictions.Add(1)
	return true
}

// releaseLocked removes e's NIC registration and unpins it. e is in no list
// and not in the index.
func (c *Cache) releaseLocked(e *entry) {
	if e.registered && c.hooks != nil {
		if e.exposed {
			c.revokeLocked(e)
		}
		if e.registered {
			c.hooks.Deregister(&e.Region)
		}
	}
	e.registered, e.exposed = false, false
	c.pins.unpin(span{e.lo, e.hi}, e.holes)
	e.state = stateReleased
	e.keep = nil
	c.nEntries--
	c.syncCounters()
}

func (c *Cache) syncCounters() {
	c.ctr.pinnedBytes.Store(uint64(c.pins.bytes))
	c.ctr.entries.Store(uint64(c.nEntries))
}

// Deregister gives back a Handle from Register. A cached entry stays pinned
// and registered for reuse; remote access to it is revoked when its last
// remote holder deregisters. An entry invalidated or flushed while in use is
// released at its last Deregister. Safe for concurrent use.
func (c *Cache) Deregister(h Handle) error {
	e := h.e
	if e == nil {
		return ErrNotRegistered
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	traceDeregister(h.addr, h.n, e.lo, e.hi)
	if e.refs <= 0 {
		return ErrNotRegistered
	}
	var err error
	if h.access.Remote() {
		e.remoteRefs--
		if e.remoteRefs == 0 {
			err = c.revokeLocked(e)
		}
	}
	e.refs--
	if e.refs > 0 {
		if !e.registered && c.hooks != nil {
			// Revocation dropped the registration other holders use:
			// register again (new keys; the peer's are void).
			if rerr := c.hooks.Register(&e.Region); rerr == nil {
				e.registered = true
			} else if err == nil {
				err = fmt.Errorf("nic register after revoke: %w", rerr)
			}
		}
		return err
	}
	switch e.state {
	case stateCached:
		if c.closed {
			c.idx.remove(e)
			c.releaseLocked(e)
		} else {
			c.lru.pushFront(e)
		}
	case stateDead, stateUncached:
		c.others.remove(e)
		c.releaseLocked(e)
	}
	return err
}

// Invalidate is the cache callback: the mapping of [addr, addr+length) is
// about to change (the memory is still mapped). Entries overlapping it leave
// the index, lose remote access and, unless in use, are released now; an
// entry in use stays valid for its holder until its last Deregister and is
// never handed out again. It returns how many entries it invalidated.
func (c *Cache) Invalidate(addr, length uintptr) int {
	return c.invalidate(addr, length, false)
}

// InvalidateUnmapped is Invalidate for a range that is already unmapped or
// replaced: nothing in it is unlocked, since it may belong to a new mapping.
func (c *Cache) InvalidateUnmapped(addr, length uintptr) int {
	return c.invalidate(addr, length, true)
}

// InvalidateIdle is Invalidate for a range that its owner is about to
// give up, provided no registration overlapping it is in use: then it
// invalidates them all and returns true; otherwise it changes nothing and
// returns false (an in-use entry would lose its remote access under its
// holder). The check and the invalidation are one step under the cache's
// lock: no registration can begin between them.
func (c *Cache) InvalidateIdle(addr, length uintptr) bool {
	if addr+length < addr {
		return false
	}
	if length == 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := pageSpan(addr, length)
	i, j := c.idx.overlapping(s.lo, s.hi)
	for _, e := range c.idx.ents[i:j] {
		if e.refs > 0 {
			return false
		}
	}
	for e := c.others.front(); e != &c.others.root; e = e.next {
		if e.lo < s.hi && s.lo < e.hi && e.refs > 0 {
			return false
		}
	}
	c.invalidateLocked(s, false)
	return true
}

func (c *Cache) invalidate(addr, length uintptr, gone bool) int {
	if length == 0 || addr+length < addr {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.invalidateLocked(pageSpan(addr, length), gone)
}

func (c *Cache) invalidateLocked(s span, gone bool) int {
	n := 0
	i, j := c.idx.overlapping(s.lo, s.hi)
	if i < j {
		hit := append(c.scratch[:0], c.idx.ents[i:j]...)
		c.idx.removeAt(i, j)
		for _, e := range hit {
			c.invalidateEntryLocked(e, s, gone)
			n++
		}
		if gone {
			// Pages gone are dropped (below), not unpinned, so nothing
			// clears the watches no cached entry needs any more: clear
			// them over the entries' part of s (s itself may be the whole
			// address space). Without this a granule stayed watched after
			// its last entry's memory was unmapped, until the monitor's
			// granule limit refused new ones.
			for _, e := range hit {
				if lo, hi := max(e.lo, s.lo), min(e.hi, s.hi); lo < hi {
					c.unwatchFree(lo, hi-lo)
				}
			}
		}
		c.scratch = hit[:0]
	}
	for e := c.others.front(); e != &c.others.root; e = e.next {
		if e.lo < s.hi && s.lo < e.hi && !(e.invalid.Load() && !gone) {
			c.invalidateEntryLocked(e, s, gone)
			n++
		}
	}
	if gone {
		c.pins.drop(s)
	}
	c.syncCounters()
	return n
}

// invalidateEntryLocked handles one entry overlapping s, already out of the
// index.
func (c *Cache) invalidateEntryLocked(e *entry, s span, gone bool) {
	traceInvalidate(e.lo, e.hi, s.lo, s.hi, gone)
	if gone {
		e.holes = append(e.holes, span{max(s.lo, e.lo), min(s.hi, e.hi)})
	}
	if e.invalid.Swap(true) {
		c.revokeLocked(e) // already counted
		return
	}
	c.ctr.invalidations.Add(1)
	switch {
	case e.state == stateCached && e.refs == 0:
		c.lru.remove(e)
		c.releaseLocked(e)
	case e.state == stateCached:
		c.ctr.inUseInval.Add(1)
		c.revokeLocked(e)
		e.state = stateDead
		c.others.pushFront(e)
	default:
		c.ctr.inUseInval.Add(1)
		c.revokeLocked(e)
	}
}

// Flush releases what owner cached: its unused entries now, its entries in
// use at their last Deregister (never handed out again). Call it before the
// owner's connection closes. It returns how many entries it flushed. Safe
// for concurrent use.
func (c *Cache) Flush(owner Owner) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flushLocked(func(e *entry) bool { return e.owner == owner })
}

func (c *Cache) flushLocked(match func(*entry) bool) int {
	n := 0
	w := 0
	ents := c.idx.ents
	for _, e := range ents {
		if match != nil && !match(e) {
			ents[w] = e
			w++
			continue
		}
		n++
		if e.refs == 0 {
			c.lru.remove(e)
			c.releaseLocked(e)
		} else {
			e.state = stateDead
			c.others.pushFront(e)
		}
	}
	clear(ents[w:])
	c.idx.ents = ents[:w]
	c.idx.starts = c.idx.starts[:0]
	for _, e := range c.idx.ents {
		c.idx.starts = append(c.idx.starts, e.lo)
	}
	return n
}

// Close releases every cached registration and stops the monitor. Entries in
// use are released at their last Deregister. Register fails with ErrClosed
// afterwards. Safe for concurrent use; later calls return nil.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.autoWaits {
		// Never started: nothing to wait for, park or close.
		c.autoWaits = false
		close(c.monReady)
	}
	c.flushLocked(nil)
	c.ctr.fullFlushes.Add(1)
	// Entries still in use are released after the monitor is gone: their
	// ranges go with its fd.
	c.pins.unwatch = nil
	c.mu.Unlock()
	unregisterCache(c)
	close(c.done)
	c.wg.Wait()
	<-c.monReady // a background start parks or closes what it started once it sees closed
	if park(c.mon, c.report) {
		return nil
	}
	return c.mon.close()
}

// drainLocked applies the monitor's pending events.
func (c *Cache) drainLocked() {
	target := c.epoch.Load()
	lost := c.mon.drain(target, func(s span, gone bool) { c.invalidateLocked(s, gone) })
	if lost > 0 {
		c.ctr.eventsLost.Add(lost)
		c.ctr.fullFlushes.Add(1)
		// Which ranges changed is unknown: treat all as unmapped, never
		// unlocking what may belong to someone else now.
		c.flushLocked(func(e *entry) bool {
			e.invalid.Store(true)
			e.holes = append(e.holes[:0], span{e.lo, e.hi})
			return true
		})
		for e := c.others.front(); e != &c.others.root; e = e.next {
			e.invalid.Store(true)
			e.holes = append(e.holes[:0], span{e.lo, e.hi})
		}
		c.pins.segs, c.pins.bytes = c.pins.segs[:0], 0
		c.syncCounters()
	}
	c.applied = target
}

// drainLoop applies monitor events as they come, so the backlog stays short
// even when nobody registers.
func (c *Cache) drainLoop(note <-chan struct{}) {
	defer c.wg.Done()
	for {
		select {
		case <-note:
			c.mu.Lock()
			if !c.closed && c.epoch.Load() != c.applied {
				c.drainLocked()
			}
			c.mu.Unlock()
		case <-c.done:
			return
		}
	}
}
