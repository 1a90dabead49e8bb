// Package pin registers memory for the NIC and caches the registrations: the
// registration cache of a Windows Sockets Direct provider, rebuilt on mlock
// and address-space monitors (docs/origins.md says what that cache is and
// how it maps onto this package; docs/locking.md where its lock stands).
//
// # Registration
//
// Cache.Register pins the page-aligned superset of a buffer (mlock, with
// per-page pin counts so that one registration's unpin never undoes
// another's lock, and MADV_DONTFORK), registers it with the NIC through
// Hooks and, for remote access, exposes it to the peer. Cache.Deregister
// keeps the registration pinned and registered in the cache (LRU) for reuse;
// remote access is revoked at once. A later Register of a buffer inside a
// cached region with no more access is a hit: no system call, no allocation.
// Registrations that overlap a cached region merge with it into one region.
//
// # Invalidation
//
// A cached region is only as good as the mapping under it. A monitor tells
// the cache when the address space changes (munmap, mremap, MAP_FIXED,
// MADV_DONTNEED_LOCKED, MADV_REMOVE, brk): the userfaultfd monitor for
// foreign memory, and Free for memory from Alloc. The cache then removes the
// overlapping regions from its index, revokes remote access and unpins them,
// but never munlocks a range already unmapped (it may belong to a new
// mapping). A region in use at that moment stays valid for its holders
// until their last Deregister (Handle.Invalidated reports it) and is never
// handed out again. Without a monitor that can watch a buffer, its
// registration is not cached: correctness before speed. Cache.Monitor tells
// which monitor runs and why the better ones cannot.
//
// The eBPF monitor (MonitorAuto's first choice where the process may load
// eBPF programs) loads in the background when a cache is created: until it
// is attached, foreign memory is registered uncached. It watches the
// process, not one cache, so it outlives the cache that loaded it: a
// closed cache leaves it idle, watching nothing, and the process's next
// cache of kind Auto or EBPF adopts it as New returns, with no load and no
// uncached window. It is detached when nobody adopts it within
// DefaultIdleMonitorLinger; SetIdleMonitorLinger changes that for the
// process, and CloseIdleMonitors detaches it at once.
//
// Limits of the userfaultfd monitor: the kernel frees an unmapped range
// before it queues the event, so a thread that maps the freed address while
// the unmapping thread still waits for its event may get the stale entry
// (the guarantee is for lookups made after munmap has returned, and the eBPF
// monitor, probing at syscall entry, closes that window); only anonymous
// private and shmem mappings can be watched (others are registered
// uncached); one cache per process can watch a range (a second cache's
// registrations of it are uncached); after mremap moves a locked range, the
// new range stays locked until unmapped; a hole punched in a shared file
// (fallocate) through another mapping raises no event.
//
// Go memory: the Go heap reuses freed addresses with no system call, so a
// cached registration keeps its buffer's object alive; the GC cannot hand
// the address out again while the registration is cached. Stack memory is
// refused (ErrStack); a slice passed to Register escapes to the heap anyway.
//
// # Concurrency
//
// A Cache is safe for concurrent use. One mutex guards its index; a hit
// holds it for a lookup, a miss for the mlock and the NIC registration (so a
// large miss delays concurrent hits). The monitor's fast path is one atomic load of an
// epoch per Register. Hooks run under the mutex and must not call back into
// the Cache. Alloc and Free are safe for concurrent use.
//
// # Errors
//
// When pages cannot be pinned, for lack of memory (mlock's ENOMEM or EAGAIN)
// or because a limit of Config would be passed, unused regions are evicted
// and pinning is tried once more; then Register fails with an error for
// which errors.Is(err, syscall.ENOBUFS) holds, and nothing has changed. A
// monitor that cannot run is reported with an error matching
// ErrNotSupported that names the missing feature. Other errors are the
// sentinels of errors.go or errors of the NIC hooks, wrapped.
package pin
