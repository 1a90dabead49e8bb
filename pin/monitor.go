package pin

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
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
			return m, rep, nil
		}
		if kind != MonitorAuto {
			return nil, rep, fmt.Errorf("monitor %s: %w", c.k, err)
		}
		rep.Skipped = append(rep.Skipped, MonitorSkip{c.k, err})
	}
	return nil, rep, fmt.Errorf("no monitor can run")
}
