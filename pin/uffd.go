package pin

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/sandirect/sandirect/internal/feature"
	"github.com/sandirect/sandirect/internal/sys"
)

// The userfaultfd monitor.
//
// Registered ranges (UFFDIO_REGISTER in write-protect mode, so that touching
// a zapped page never blocks on a missing-page fault nobody serves) raise
// UNMAP, REMOVE and REMAP events. The kernel holds the thread that unmaps
// until the event is read. The handler goroutine, on a locked OS thread:
//
//  1. polls the uffd;
//  2. bumps dirty — before reading, so before any unmapping thread can go
//     on: after munmap returns, every lookup sees dirty != applied;
//  3. reads every pending event and pushes its range on a bounded lock-free
//     queue (merging with the last queued range when they touch; a full
//     queue counts the event lost, and the cache flushes everything);
//  4. publishes the epoch of step 2 and pokes the cache's drain goroutine.
//
// It takes no lock at all (only the queue's atomics and a non-blocking
// channel send), allocates nothing, and never waits for the cache: an
// unmapping thread may hold any lock of the program, including the cache's.
// Applying events — index removal, NIC revocation, munlock — happens in the
// cache, under its lock, off the unmapping thread.
type uffdMonitor struct {
	fd, stop  int
	flags     int           // userfaultfd flags used (UffdUserModeOnly or 0)
	dirty     atomic.Uint64 // bumped by the handler before it reads events
	published atomic.Uint64 // events up to this epoch are in q
	lost      atomic.Uint64 // events dropped on a full queue since the last drain
	dead      atomic.Bool   // the handler has exited
	q         rangeQueue
	note      chan struct{}
	done      chan struct{}
	msgs      [64]sys.UffdMsg // the handler's read buffer
}

const uffdFeatures = sys.UffdFeatureEventUnmap | sys.UffdFeatureEventRemove | sys.UffdFeatureEventRemap

// openUffd opens a userfaultfd with the events the cache needs.
// UFFD_USER_MODE_ONLY is asked for when unprivileged: vm.unprivileged_userfaultfd
// may be 0, and the cache never serves faults, from kernel mode or any.
func openUffd() (fd, flags int, err error) {
	flags = sys.UffdUserModeOnly
	if sys.Geteuid() == 0 {
		flags = 0
	}
	fd, err = sys.Userfaultfd(flags)
	if err != nil && flags == 0 && errors.Is(err, sys.EPERM) {
		flags = sys.UffdUserModeOnly
		fd, err = sys.Userfaultfd(flags)
	}
	if err != nil && flags != 0 && errors.Is(err, sys.EINVAL) {
		flags = 0 // before Linux 5.11
		fd, err = sys.Userfaultfd(flags)
	}
	if err != nil {
		return -1, 0, feature.Unsupported("userfaultfd", "4.3", err)
	}
	got, err := sys.UffdAPI(fd, uffdFeatures)
	if err == nil && got&uffdFeatures != uffdFeatures {
		err = fmt.Errorf("kernel grants features %#x, need %#x", got, uffdFeatures)
	}
	if err != nil {
		sys.Close(fd)
		return -1, 0, feature.Unsupported("userfaultfd UNMAP/REMOVE/REMAP events", "4.11", err)
	}
	return fd, flags, nil
}

func startUffd(backlog int) (monitor, error) {
	fd, flags, err := openUffd()
	if err != nil {
		return nil, err
	}
	// A write-protect registration of anonymous memory is what watch
	// does: check that it works here on a scratch page.
	p, err := sys.MmapAnon(0, uintptr(sys.PageSize), 0)
	if err != nil {
		sys.Close(fd)
		return nil, err
	}
	werr := sys.UffdRegister(fd, p, uintptr(sys.PageSize), sys.UffdRegisterModeWP)
	sys.UffdUnregister(fd, p, uintptr(sys.PageSize))
	sys.MunmapRange(p, uintptr(sys.PageSize))
	if werr != nil {
		sys.Close(fd)
		return nil, feature.Unsupported("userfaultfd write-protect registration", "5.7", werr)
	}
	stop, err := sys.Eventfd()
	if err != nil {
		sys.Close(fd)
		return nil, err
	}
	m := &uffdMonitor{fd: fd, stop: stop, flags: flags, note: make(chan struct{}, 1), done: make(chan struct{})}
	m.q.init(backlog)
	go m.handle()
	return m, nil
}

func (m *uffdMonitor) kind() MonitorKind { return MonitorUserfaultfd }

func (m *uffdMonitor) watch(s span) error {
	if err := sys.UffdRegister(m.fd, s.lo, s.len(), sys.UffdRegisterModeWP); err != nil {
		return fmt.Errorf("userfaultfd register: %w", err)
	}
	return nil
}

func (m *uffdMonitor) unwatch(addr, length uintptr) {
	sys.UffdUnregister(m.fd, addr, length)
}

func (m *uffdMonitor) epoch() *atomic.Uint64 { return &m.dirty }

func (m *uffdMonitor) notify() <-chan struct{} { return m.note }

func (m *uffdMonitor) drain(target uint64, apply func(span, bool)) uint64 {
	// The handler bumped dirty and is reading; it takes no lock and waits
	// for nobody, so this wait is short.
	for m.published.Load() < target && !m.dead.Load() {
		runtime.Gosched()
	}
	for {
		lo, hi, gone, ok := m.q.pop()
		if !ok {
			break
		}
		if hi > lo {
			apply(pageSpan(lo, hi-lo), gone)
		}
	}
	return m.lost.Swap(0)
}

func (m *uffdMonitor) handle() {
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	defer close(m.done)
	defer m.dead.Store(true)
	for {
		ru, rs, err := sys.PollIn(m.fd, m.stop)
		if err != nil {
			if errors.Is(err, sys.EINTR) {
				continue
			}
			return
		}
		if rs != 0 || ru&sys.PollError != 0 {
			return
		}
		seq := m.dirty.Add(1)
		for {
			n, err := sys.UffdRead(m.fd, m.msgs[:])
			if err != nil || n == 0 {
				break // EAGAIN: all read
			}
			for i := range m.msgs[:n] {
				m.push(&m.msgs[i])
			}
		}
		m.published.Store(seq)
		select {
		case m.note <- struct{}{}:
		default:
		}
	}
}

func (m *uffdMonitor) push(msg *sys.UffdMsg) {
	var lo, hi uintptr
	gone := true
	switch msg.Event {
	case sys.UffdEventUnmap:
		lo, hi = uintptr(msg.A0), uintptr(msg.A1)
	case sys.UffdEventRemove:
		// MADV_DONTNEED_LOCKED, MADV_REMOVE, …: still mapped, pages zapped.
		lo, hi, gone = uintptr(msg.A0), uintptr(msg.A1), false
	case sys.UffdEventRemap:
		lo, hi = uintptr(msg.A0), uintptr(msg.A0+msg.A2) // the old range
	default:
		return
	}
	if !m.q.push(lo, hi, gone) {
		m.lost.Add(1)
	}
}

func (m *uffdMonitor) close() error {
	sys.EventfdSignal(m.stop)
	<-m.done
	// Closing the uffd lets any unmapping thread still waiting go on and
	// unregisters every range.
	err := sys.Close(m.fd)
	sys.Close(m.stop)
	return err
}

// rangeQueue is a bounded single-producer single-consumer queue of address
// ranges. The producer may merge a range into the newest queued one while
// the consumer has not taken it; each slot's state word hands it between
// the two (full → busy by CAS, then back), which orders the plain fields.
type rangeQueue struct {
	slots []qslot
	mask  uint64
	head  atomic.Uint64 // next to pop; written by the consumer
	tail  atomic.Uint64 // next to push; written by the producer
}

type qslot struct {
	state  atomic.Uint32
	lo, hi uintptr
	gone   bool
}

const (
	slotEmpty uint32 = iota
	slotFull
	slotBusy
)

func (q *rangeQueue) init(n int) {
	size := 1
	for size < n {
		size <<= 1
	}
	q.slots = make([]qslot, size)
	q.mask = uint64(size - 1)
}

// push queues [lo, hi), merging it into the newest queued range when they
// overlap or touch and are of the same kind. It returns false when full.
func (q *rangeQueue) push(lo, hi uintptr, gone bool) bool {
	t := q.tail.Load()
	if t != q.head.Load() {
		s := &q.slots[(t-1)&q.mask]
		if s.state.CompareAndSwap(slotFull, slotBusy) {
			merged := s.gone == gone && lo <= s.hi && s.lo <= hi
			if merged {
				s.lo, s.hi = min(s.lo, lo), max(s.hi, hi)
			}
			s.state.Store(slotFull)
			if merged {
				return true
			}
		}
	}
	if t-q.head.Load() == uint64(len(q.slots)) {
		return false
	}
	s := &q.slots[t&q.mask]
	s.lo, s.hi, s.gone = lo, hi, gone
	s.state.Store(slotFull)
	q.tail.Store(t + 1)
	return true
}

// pop takes the oldest queued range.
func (q *rangeQueue) pop() (lo, hi uintptr, gone, ok bool) {
	h := q.head.Load()
	if h == q.tail.Load() {
		return 0, 0, false, false
	}
	s := &q.slots[h&q.mask]
	for !s.state.CompareAndSwap(slotFull, slotBusy) {
		runtime.Gosched() // the producer is merging into it
	}
	lo, hi, gone = s.lo, s.hi, s.gone
	s.state.Store(slotEmpty)
	q.head.Store(h + 1)
	return lo, hi, gone, true
}
