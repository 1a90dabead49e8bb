package pin

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// MonitorKind names a way of learning that the address space changed under
// a cached registration (the OS's notice of release: docs/origins.md).
type MonitorKind int

const (
	// MonitorAuto picks the best monitor that can run, in the order below.
	MonitorAuto MonitorKind = iota
	// MonitorEBPF: eBPF probes at the entry of munmap and its relatives
	// (ebpf.go). The probe publishes before the system call acts, so no
	// thread can see a stale hit once the call has returned.
	MonitorEBPF
	// MonitorUserfaultfd: userfaultfd UNMAP, REMOVE and REMAP events on the
	// registered ranges. The kernel holds the unmapping thread until the
	// event is read, so no stale hit is possible after munmap returns.
	MonitorUserfaultfd
	// MonitorOwned: only memory from Alloc is cached (Free invalidates
	// synchronously); foreign buffers are registered uncached.
	MonitorOwned
	// MonitorNone: nothing is cached; every Deregister releases.
	MonitorNone
)

func (k MonitorKind) String() string {
	switch k {
	case MonitorAuto:
		return "auto"
	case MonitorEBPF:
		return "ebpf"
	case MonitorUserfaultfd:
		return "userfaultfd"
	case MonitorOwned:
		return "owned"
	case MonitorNone:
		return "none"
	}
	return fmt.Sprintf("MonitorKind(%d)", int(k))
}

// MonitorReport tells which monitor runs and why better ones do not.
type MonitorReport struct {
	Kind    MonitorKind   // the monitor that runs (never MonitorAuto)
	Skipped []MonitorSkip // the better ones, in order, with the reason
	// Starting says that MonitorAuto's choice is not made yet: it starts
	// with the cache's first registration of foreign memory, or a call to
	// Cache.Monitor, and runs in the background; meanwhile Kind is
	// MonitorOwned (see Cache.CurrentMonitor).
	Starting bool
	// Attach says how the eBPF monitor's probes are attached: "tracepoint"
	// (syscalls/sys_enter_munmap and its siblings: nothing runs for the
	// other system calls of the host), "tp_btf" or "raw_tracepoint" (one
	// program at every system call of the host), "kprobe". Empty for the
	// other monitors.
	Attach string
}

// MonitorSkip is a monitor that could not run, and why; Err matches
// ErrNotSupported when a kernel feature or privilege is missing.
type MonitorSkip struct {
	Kind MonitorKind
	Err  error
}

func (r MonitorReport) String() string {
	var b strings.Builder
	b.WriteString(r.Kind.String())
	if r.Attach != "" {
		fmt.Fprintf(&b, " (%s)", r.Attach)
	}
	if r.Starting {
		b.WriteString(" (the best monitor not running yet)")
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(&b, "; %s: %v", s.Kind, s.Err)
	}
	return b.String()
}

// monitor is the interface every monitor implements. The contract that makes
// the cache's fast path one atomic load:
//
//   - epoch returns a counter the monitor advances before any address-space
//     change it reports can complete (before munmap returns in the thread
//     that called it). The cache compares it with the last epoch it applied;
//     when equal, no reported change is pending and the index can be
//     trusted.
//   - drain(target) passes to apply every change published up to epoch
//     target (waiting for the monitor to publish them if need be; never for
//     long) and returns how many events were lost (then the cache flushes
//     everything).
//
// An eBPF monitor fits as is: its epoch is the word in the BPF_F_MMAPABLE
// array the probes bump, drain reads the ring buffer. A synchronous monitor
// (owned memory, none) has an epoch that never moves.
type monitor interface {
	kind() MonitorKind
	// watch starts watching s (page aligned) for changes; an error means
	// the range cannot be watched, and its registration is not cached.
	watch(s span) error
	// unwatch stops watching [addr, addr+length), whose pages are no longer
	// pinned.
	unwatch(addr, length uintptr)
	epoch() *atomic.Uint64
	drain(target uint64, apply func(s span, gone bool)) (lost uint64)
	// notify returns a channel that receives when changes are pending, or
	// nil for a monitor that never has any.
	notify() <-chan struct{}
	close() error
}

var errNotWatched = errors.New("memory not watched by the monitor")

// static is the monitor of MonitorOwned and MonitorNone: foreign memory is
// never watched, and owned memory is invalidated synchronously by Free.
type static struct{ k MonitorKind }

var staticEpoch atomic.Uint64 // never written

func (m static) kind() MonitorKind                   { return m.k }
func (static) watch(span) error                      { return errNotWatched }
func (static) unwatch(uintptr, uintptr)              {}
func (static) epoch() *atomic.Uint64                 { return &staticEpoch }
func (static) drain(uint64, func(span, bool)) uint64 { return 0 }
func (static) notify() <-chan struct{}               { return nil }
func (static) close() error                          { return nil }

// startMonitor starts the monitor of kind (MonitorAuto: the best that runs).
func startMonitor(kind MonitorKind, backlog int) (monitor, MonitorReport, error) {
	var rep MonitorReport
	type cand struct {
		k     MonitorKind
		start func(int) (monitor, error)
	}
	cands := []cand{
		{MonitorEBPF, startEBPF},
		{MonitorUserfaultfd, startUffd},
		{MonitorOwned, func(int) (monitor, error) { return static{MonitorOwned}, nil }},
		{MonitorNone, func(int) (monitor, error) { return static{MonitorNone}, nil }},
	}
	for _, c := range cands {
		if kind != MonitorAuto && kind != c.k {
			continue
		}
		m, err := c.start(backlog)
		if err == nil {
			rep.Kind = c.k
			if a, ok := m.(interface{ attach() string }); ok {
				rep.Attach = a.attach()
			}
			return m, rep, nil
		}
		if kind != MonitorAuto {
			return nil, rep, fmt.Errorf("monitor %s: %w", c.k, err)
		}
		rep.Skipped = append(rep.Skipped, MonitorSkip{c.k, err})
	}
	return nil, rep, fmt.Errorf("no monitor can run")
}

// testHookNiceLoad, when set, is told the thread id of a background load
// that runs at the lower priority, before the load.
var testHookNiceLoad atomic.Pointer[func(tid int)]

// loadNiceFor bounds how long the background load runs at the lowest
// priority: the first connection's few milliseconds, not a busy
// program's life.
const loadNiceFor = 10 * time.Millisecond

// startAuto prepares MonitorAuto's choice, which starts with the cache's
// first registration of foreign memory (or a call to Monitor) and runs in
// the background (beginAutoLocked): loading and attaching the eBPF probes
// takes tens of milliseconds, which a first connection should not wait
// for, and a program whose registrations are all of memory from Alloc —
// a connection's control buffers, staging and copies, all that its
// small messages use — never needs it, and never puts the host's
// system calls on the traced path (docs/setup.md, "The monitor when it
// is needed"). Until the monitor is adopted the cache runs as
// MonitorOwned: memory from Alloc is cached, foreign memory is registered
// uncached, so no stale hit is possible in the window.
func (c *Cache) startAuto() {
	c.mon = static{MonitorOwned}
	c.epoch = c.mon.epoch()
	c.report = MonitorReport{Kind: MonitorOwned, Starting: true}
	c.autoWaits = true
}

// beginAutoLocked starts MonitorAuto's background load if it waits for
// its start. The caller holds mu.
func (c *Cache) beginAutoLocked() {
	if !c.autoWaits {
		return
	}
	c.autoWaits = false
	go func() {
		// The load starts at the lowest priority, so that its verifier
		// work yields the CPU to the connection that started it and to the peer
		// that answers, for loadNiceFor at most: where other threads keep
		// the CPUs busy (busy polling) it would not run at all, and
		// foreign memory would stay uncached (docs/setup.md). Without the
		// right to restore the priority it runs as before.
		runtime.LockOSThread()
		renice := func() {}
		if restore, err := sys.NiceThread(19); err == nil {
			var back sync.Once // the priority is restored
			renice = func() {
				back.Do(func() {
					// If a changed limit made it fail, the thread serves
					// on at the lower priority: slower under load, never
					// wrong. It is never ended (a locked goroutine's
					// exit), which would kill the children started from
					// it with a parent-death signal.
					_ = restore()
				})
			}
			// The hook sees the lowered priority before the timer that
			// bounds it starts (a load descheduled past loadNiceFor
			// would otherwise show the old one).
			if h := testHookNiceLoad.Load(); h != nil {
				(*h)(sys.Gettid())
			}
			// The timer's renice runs while this goroutine still holds
			// the thread (the one below waits for it to finish), or
			// finds it restored: restore names the thread by its id.
			t := time.AfterFunc(loadNiceFor, renice)
			defer t.Stop()
		}
		m, rep, err := startMonitor(MonitorAuto, c.cfg.MaxBacklog)
		renice() // before the adoption tells anyone the load is over
		runtime.UnlockOSThread()
		if err == nil && rep.Kind == MonitorEBPF {
			// Last (deferred), once the monitor is adopted: the load's
			// garbage back to the system (freeLoadGarbage).
			defer freeLoadGarbage()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		// Ready is told under mu, with the adoption (deferred calls run
		// last first): a registration that finds the new monitor finds
		// monReady closed too.
		defer close(c.monReady)
		if err != nil { // Owned and None always start: not reached
			return
		}
		if c.closed {
			// Left idle for the next cache (idle.go): the load is done.
			if !park(m, rep) {
				m.close()
			}
			return
		}
		c.adoptLocked(m, rep)
	}()
}

// testHookLoadFreed, when set, is called once a background eBPF load's
// garbage is given back (freeLoadGarbage).
var testHookLoadFreed atomic.Pointer[func()]

// freeLoadGarbage gives the heap an eBPF load dropped back to the system.
// Loading parses the kernel's BTF: some 5 MB allocated and dropped within
// the load, which the Go heap would otherwise keep resident until a
// collection and its scavenger came round to it — for minutes in a quiet
// program, whose resident memory the first connection would leave a
// third larger (docs/setup.md, "What the load leaves in memory"). One
// collection and scavenge, in the loading goroutine, once a load.
func freeLoadGarbage() {
	debug.FreeOSMemory()
	if h := testHookLoadFreed.Load(); h != nil {
		(*h)()
	}
}

// adoptLocked makes m the cache's monitor. Nothing foreign is cached yet
// (the placeholder watches nothing); the events m reported since it
// attached are drained, so that the epoch applied is m's from now on.
func (c *Cache) adoptLocked(m monitor, rep MonitorReport) {
	c.mon, c.report = m, rep
	c.epoch = m.epoch()
	c.applied = 0
	if n := m.notify(); n != nil {
		c.wg.Add(1) // before Close's Wait: Close sets closed under mu first
		go c.drainLoop(n)
	}
	if c.epoch.Load() != c.applied {
		c.drainLocked()
	}
}

// granular is a monitor that watches whole granules of address space
// rather than the ranges it is given (eBPF: 2 MiB). Its watch sets every
// granule a range touches and its unwatch clears them: not counts, since
// the pages unpinned together rarely match the ranges watched together.
type granular interface {
	granule() uintptr
}

// unwatchFree is the pin table's unwatch: [addr, addr+length) is no longer
// pinned. A granular monitor keeps watching every granule that a cached
// entry still touches; the others are cleared. The caller holds mu.
func (c *Cache) unwatchFree(addr, length uintptr) {
	g, ok := c.mon.(granular)
	if !ok {
		c.mon.unwatch(addr, length)
		return
	}
	size := g.granule()
	end := addr + length
	if end < addr {
		end = ^uintptr(0)
	}
	for a := addr &^ (size - 1); a < end && a+size > a; a += size {
		if i, j := c.idx.overlapping(a, a+size); i < j {
			continue // a cached entry relies on it
		}
		c.mon.unwatch(a, size)
	}
}

// watchMergedLocked makes sure every granule of s, a new cached entry's
// span, is watched as the entry enters the index: a merge widens the
// span beyond the range watched at the miss, and an eviction while
// pinning may have cleared a granule of a merged entry. Monitors that
// watch exact ranges need nothing more. It tells whether s is watched.
func (c *Cache) watchMergedLocked(s span) bool {
	if _, ok := c.mon.(granular); !ok || isOwned(s) {
		return true
	}
	return c.mon.watch(s) == nil
}
