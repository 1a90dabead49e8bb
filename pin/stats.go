package pin

import "sync/atomic"

// Stats is a snapshot of a Cache's counters.
type Stats struct {
	Gets               uint64 // Register calls
	Hits               uint64 // served from the cache, without a system call
	Misses             uint64 // served by pinning and registering anew
	Failures           uint64 // Register calls that failed
	Evictions          uint64 // unused entries released to make room
	Invalidations      uint64 // entries removed because their memory changed
	InUseInvalidations uint64 // of which were in use at the time
	EventsLost         uint64 // monitor events dropped (each forced a full flush)
	FullFlushes        uint64 // whole-cache flushes (lost events, Close)
	PinnedBytes        uint64 // bytes locked now
	Entries            uint64 // registrations alive now (cached, in use, dying)
}

// counters are the live counters: each is written under Cache.mu and read
// with an atomic load from anywhere.
type counters struct {
	hits, misses, failures    atomic.Uint64
	evictions                 atomic.Uint64
	invalidations, inUseInval atomic.Uint64
	eventsLost, fullFlushes   atomic.Uint64
	pinnedBytes, entries      atomic.Uint64
}

// Stats returns the counters. It takes no lock, so the fields may come from
// slightly different instants. Safe for concurrent use.
func (c *Cache) Stats() Stats {
	s := Stats{
		Hits:               c.ctr.hits.Load(),
		Misses:             c.ctr.misses.Load(),
		Failures:           c.ctr.failures.Load(),
		Evictions:          c.ctr.evictions.Load(),
		Invalidations:      c.ctr.invalidations.Load(),
		InUseInvalidations: c.ctr.inUseInval.Load(),
		EventsLost:         c.ctr.eventsLost.Load(),
		FullFlushes:        c.ctr.fullFlushes.Load(),
		PinnedBytes:        c.ctr.pinnedBytes.Load(),
		Entries:            c.ctr.entries.Load(),
	}
	s.Gets = s.Hits + s.Misses + s.Failures
	return s
}
