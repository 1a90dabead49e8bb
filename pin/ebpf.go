package pin

import (
	"os"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/internal/sys"
)

// ebpfMon is monitor 1: eBPF probes at the entry of munmap, mremap,
// madvise (discarding advice), brk (shrinking), mmap (MAP_FIXED) and shmdt
// in this process, filtered to the granules of cached ranges. A probe bumps
// the epoch word (mapped from a BPF_F_MMAPABLE array) before the system
// call does anything, so once the call has returned in any thread, every
// lookup sees an epoch it has not applied and drains the ring first: no
// stale hit, in any thread, with one atomic load on the hit path.
type ebpfMon struct {
	m    *bpfmon.Monitor
	ep   *atomic.Uint64
	note chan struct{}
	// stop and done belong to the running watchRing: nil while the
	// monitor is idle (idle.go). Set and cleared by run and halt, which
	// its owner calls, one at a time.
	stop  chan struct{}
	done  chan struct{}
	ring  int // ebpfRingSize when it was opened: an idle one serves caches that want the same
	pages uintptr
	// set holds the watched granules (see granular); guarded by the
	// Cache's mu, under which watch, unwatch and drain are called.
	set map[uint64]struct{}
	// A drain's invalidations may release the last entry on a granule,
	// whose unwatch would take the Monitor's locks that Sync holds while
	// it applies events (its lifetime lock for reading a second time,
	// which a Close waiting between the two deadlocks, and its control
	// lock under its drain lock): while draining, the granules to unwatch
	// wait in deferred until Sync returns. Guarded by the Cache's mu.
	draining bool
	deferred []uint64
}

// ebpfRingSize overrides the probes' ring buffer size (tests force an
// overflow with a small one); 0 keeps bpfmon's default.
var ebpfRingSize int

func startEBPF(int) (monitor, error) {
	cfg := bpfmon.DefaultConfig()
	if ebpfRingSize > 0 {
		cfg.RingSize = ebpfRingSize
	}
	m, err := bpfmon.Open(&cfg)
	if err != nil {
		return nil, err
	}
	if err := m.AddPid(os.Getpid()); err != nil {
		m.Close()
		return nil, err
	}
	e := &ebpfMon{
		m:     m,
		ep:    m.EpochAtomic(),
		note:  make(chan struct{}),
		ring:  ebpfRingSize,
		pages: uintptr(sys.PageSize),
		set:   map[uint64]struct{}{},
	}
	e.run()
	return e, nil
}

// run starts the goroutine that tells the cache of pending events.
func (e *ebpfMon) run() {
	e.stop, e.done = make(chan struct{}), make(chan struct{})
	go e.watchRing(e.stop, e.done)
}

// halt stops the goroutine run started, if it runs.
func (e *ebpfMon) halt() {
	if e.stop == nil {
		return
	}
	close(e.stop)
	<-e.done
	e.stop, e.done = nil, nil
}

// reset makes a monitor whose cache closed fit for another: nothing
// watched, no event pending, no loss recorded, its goroutine stopped. An
// error means the ring could not be read: the monitor must be closed.
func (e *ebpfMon) reset() error {
	e.halt()
	for g := range e.set {
		e.m.Unwatch(uintptr(g<<bpfmon.GranuleShift), 1<<bpfmon.GranuleShift)
	}
	clear(e.set)
	// What the probes published for the granules watched until now is of
	// no use to the next cache, which caches nothing yet.
	_, err := e.m.Sync(func(bpfmon.Event) {}, nil)
	return err
}

// drainPeriod is how often the background drain looks for events that no
// lookup has applied yet.
const drainPeriod = 20 * time.Millisecond

// watchRing tells the cache's drain loop, every drainPeriod, when events
// wait in the ring, so the backlog stays short even when nobody registers.
// It polls the epoch instead of sleeping on the ring buffer: a wake-up per
// event would take a CPU from busy-polling threads each time the Go
// runtime returns memory near a registration, and lookups drain
// synchronously anyway (one atomic load tells them to).
func (e *ebpfMon) watchRing(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(drainPeriod)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if e.m.Epoch() == e.m.Synced() {
				continue
			}
			select {
			case e.note <- struct{}{}:
			case <-stop:
				return
			}
		case <-stop:
			return
		}
	}
}

func (*ebpfMon) kind() MonitorKind { return MonitorEBPF }

func (*ebpfMon) granule() uintptr { return 1 << bpfmon.GranuleShift }

func (e *ebpfMon) attach() string { return string(e.m.Method()) }

// watch sets the granules of s that are not set yet; on failure it clears
// those it set.
func (e *ebpfMon) watch(s span) error {
	if s.hi <= s.lo {
		return nil
	}
	var fresh []uint64
	for g := uint64(s.lo) >> bpfmon.GranuleShift; g <= uint64(s.hi-1)>>bpfmon.GranuleShift; g++ {
		if _, ok := e.set[g]; ok {
			continue
		}
		if err := e.m.Watch(uintptr(g<<bpfmon.GranuleShift), 1<<bpfmon.GranuleShift); err != nil {
			for _, h := range fresh {
				e.clear(h)
			}
			return err
		}
		e.set[g] = struct{}{}
		fresh = append(fresh, g)
	}
	return nil
}

// unwatch clears the granules that [addr, addr+length) touches.
func (e *ebpfMon) unwatch(addr, length uintptr) {
	if length == 0 || addr+length < addr {
		return
	}
	for g := uint64(addr) >> bpfmon.GranuleShift; g <= uint64(addr+length-1)>>bpfmon.GranuleShift; g++ {
		e.clear(g)
	}
}

func (e *ebpfMon) clear(g uint64) {
	if _, ok := e.set[g]; ok {
		delete(e.set, g)
		if e.draining {
			e.deferred = append(e.deferred, g)
			return
		}
		e.m.Unwatch(uintptr(g<<bpfmon.GranuleShift), 1<<bpfmon.GranuleShift)
	}
}

func (e *ebpfMon) epoch() *atomic.Uint64 { return e.ep }

func (e *ebpfMon) drain(_ uint64, apply func(s span, gone bool)) (lost uint64) {
	e.draining = true
	defer func() {
		e.draining = false
		// The Monitor counts references per granule: one re-watched
		// since its clear holds its own, and this drops the old one.
		for _, g := range e.deferred {
			e.m.Unwatch(uintptr(g<<bpfmon.GranuleShift), 1<<bpfmon.GranuleShift)
		}
		e.deferred = e.deferred[:0]
	}()
	_, err := e.m.Sync(func(ev bpfmon.Event) {
		lo := ev.Start &^ (e.pages - 1)
		hi := ev.Start + ev.Length
		if ev.Unknown || hi < ev.Start {
			hi = ^uintptr(0)
		}
		hi = (hi + e.pages - 1) &^ (e.pages - 1)
		if hi < lo { // rounded past the top
			hi = ^uintptr(0) &^ (e.pages - 1)
		}
		// madvise discards contents but keeps the mapping; everything else
		// removes or replaces the mapping.
		apply(span{lo, hi}, ev.Syscall != bpfmon.Madvise)
	}, func() { lost++ })
	if err != nil && lost == 0 {
		lost = 1 // the ring could not be read: treat as lost events
	}
	return lost
}

func (e *ebpfMon) notify() <-chan struct{} { return e.note }

func (e *ebpfMon) close() error {
	e.halt()
	return e.m.Close()
}
