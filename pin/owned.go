package pin

import (
	"fmt"
	"slices"
	"sync"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
)

// owned is the registry of memory handed out by Alloc.
var owned struct {
	mu lockrank.RWMutex // guards lo, hi; taken after any Cache.mu
	lo []uintptr        // sorted starts of live allocations
	hi []uintptr        // their ends (page aligned)
}

// caches is the set of open caches, which Free invalidates.
var caches struct {
	mu  lockrank.Mutex // guards set; never held while calling into a Cache
	set map[*Cache]struct{}
}

// The registries' locks are ranked before any goroutine can take them.
func init() {
	owned.mu.Init(lockrank.PinOwned)
	caches.mu.Init(lockrank.PinCaches)
}

func registerCache(c *Cache) {
	caches.mu.Lock()
	defer caches.mu.Unlock()
	if caches.set == nil {
		caches.set = make(map[*Cache]struct{})
	}
	caches.set[c] = struct{}{}
}

func unregisterCache(c *Cache) {
	caches.mu.Lock()
	defer caches.mu.Unlock()
	delete(caches.set, c)
}

// Alloc returns n bytes (n > 0) of off-heap memory, page aligned, zeroed,
// excluded from fork (MADV_DONTFORK). Every cache caches registrations of it
// whatever its monitor, because Free invalidates them synchronously before
// unmapping: the fastest path for applications that can allocate from us.
// Release it with Free, never with anything else. Safe for concurrent use.
func Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, ErrEmpty
	}
	length := (uintptr(n) + pageMask) &^ pageMask
	addr, err := sys.MmapAnon(0, length, 0)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", length, err)
	}
	if err := sys.Madvise(addr, length, sys.MadvDontfork); err != nil {
		sys.MunmapRange(addr, length)
		return nil, fmt.Errorf("madvise dontfork: %w", err)
	}
	owned.mu.Lock()
	i, _ := slices.BinarySearch(owned.lo, addr)
	owned.lo = slices.Insert(owned.lo, i, addr)
	owned.hi = slices.Insert(owned.hi, i, addr+length)
	owned.mu.Unlock()
	return sys.Bytes(addr, uintptr(n))[:n:n], nil
}

// Free invalidates every registration of b in every open cache, then unmaps
// it. b must be a slice returned by Alloc (same start); registrations of it
// still in use stay valid for their holders but the memory is gone, so
// deregister first. Safe for concurrent use.
func Free(b []byte) error {
	addr := sys.Addr(b)
	owned.mu.Lock()
	i, found := slices.BinarySearch(owned.lo, addr)
	if !found || len(b) == 0 {
		owned.mu.Unlock()
		return ErrNotOwned
	}
	length := owned.hi[i] - addr
	owned.lo = slices.Delete(owned.lo, i, i+1)
	owned.hi = slices.Delete(owned.hi, i, i+1)
	owned.mu.Unlock()

	caches.mu.Lock()
	open := make([]*Cache, 0, len(caches.set))
	for c := range caches.set {
		open = append(open, c)
	}
	caches.mu.Unlock()
	for _, c := range open {
		c.InvalidateUnmapped(addr, length)
	}
	if err := sys.MunmapRange(addr, length); err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return nil
}

// isOwned tells whether s lies inside one allocation of Alloc.
func isOwned(s span) bool {
	owned.mu.RLock()
	defer owned.mu.RUnlock()
	i, found := slices.BinarySearch(owned.lo, s.lo)
	if !found {
		i--
	}
	return i >= 0 && owned.lo[i] <= s.lo && s.hi <= owned.hi[i]
}

// cacheableLocked tells whether a registration of s may be cached: its
// memory is ours (Alloc), or the monitor now watches it.
func (c *Cache) cacheableLocked(s span) bool {
	if c.cfg.Monitor == MonitorNone {
		return false
	}
	if isOwned(s) {
		return true
	}
	c.beginAutoLocked()
	return c.mon.watch(s) == nil
}

var mainStack struct {
	once   sync.Once
	lo, hi uintptr
}

// onStack tells whether [lo, hi) touches the main thread's stack.
//
// Goroutine stacks need no check: a []byte handed to Register escapes to the
// heap (the cache keeps it), so the compiler never places one on a goroutine
// stack; only memory forged from a raw address could be there. The main
// thread's stack ([stack] in /proc/self/maps; Go runs no goroutine on it,
// but C code and forged slices can point into it) is refused outright.
func onStack(lo, hi uintptr) bool {
	mainStack.once.Do(func() {
		mainStack.lo, mainStack.hi, _ = sys.MainStack()
	})
	return mainStack.hi != 0 && lo < mainStack.hi && mainStack.lo < hi
}
