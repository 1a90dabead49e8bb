package nic

import (
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/shm"
)

// Opcode names a work request's operation.
type Opcode uint8

const (
	OpSend Opcode = iota + 1
	OpRecv
	OpWrite
	OpRead
)

func (o Opcode) String() string {
	switch o {
	case OpSend:
		return "send"
	case OpRecv:
		return "recv"
	case OpWrite:
		return "rdma-write"
	case OpRead:
		return "rdma-read"
	}
	return "op?"
}

// Completion reports a finished work request.
type Completion struct {
	ID     uint64
	Op     Opcode
	Status Status
	Bytes  int // bytes moved: received for OpRecv, transferred otherwise
	QP     *QueuePair
	Reason error // detail for a failed status; nil on success
}

// Err returns nil for a successful completion and a *CompletionError
// otherwise.
func (c *Completion) Err() error {
	if c.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{Status: c.Status, Op: c.Op, ID: c.ID, Reason: c.Reason}
}

// CompletionQueue collects completions of one or more queue pairs. It is
// safe for concurrent use. Polling or waiting on a queue pair's receive
// CQ is what moves its incoming sends into posted receives.
type CompletionQueue struct {
	dev  *Device
	wait shm.WaitConfig

	mu sync.Mutex // guards q, head; never held while calling into a QP
	q  []Completion
	hd int
	n  atomic.Int32 // len(q) - hd, for pollers that look without the lock

	qps   atomic.Pointer[[]*QueuePair] // QPs whose receives this CQ drives; copy on write
	sqps  atomic.Pointer[[]*QueuePair] // QPs whose queued send work this CQ's pollers run; copy on write
	dirty atomic.Bool                  // qps changed since the waiter built ws
	woken atomic.Bool                  // Wake was called: the next Wait returns early

	waitMu sync.Mutex // serializes waiters; guards ws
	ws     shm.WaitSet
	wsQPs  []*QueuePair
	ready  func() bool
}

// NewCQ creates a completion queue.
func (d *Device) NewCQ() *CompletionQueue {
	cq := &CompletionQueue{dev: d, wait: d.cfg.Wait}
	cq.qps.Store(new([]*QueuePair))
	cq.sqps.Store(new([]*QueuePair))
	cq.ready = cq.readyToWake
	return cq
}

// readyToWake tells a waiter (holding waitMu) not to sleep: completions
// are queued, the set changed, or a queue pair with posted receives has
// something in its ring. Records waiting for a receive do not count:
// PostRecv moves them and rings the CQ itself.
func (cq *CompletionQueue) readyToWake() bool {
	if cq.dirty.Load() || cq.woken.Load() || cq.pending() {
		return true
	}
	ready := false
	for _, qp := range cq.wsQPs {
		if qp.inPending() { // on every queue pair: it releases lazy space too
			ready = true
		}
	}
	return ready
}

// attachSend makes pollers of cq run qp's queued send work themselves
// (besides the engine): a caller busy-polling for a completion then moves
// its own data instead of waiting for the engine goroutine to get a CPU.
func (cq *CompletionQueue) attachSend(qp *QueuePair) {
	cq.mu.Lock()
	next := append(slices.Clip(*cq.sqps.Load()), qp)
	cq.sqps.Store(&next)
	cq.mu.Unlock()
}

func (cq *CompletionQueue) detachSend(qp *QueuePair) {
	cq.mu.Lock()
	next := slices.DeleteFunc(slices.Clone(*cq.sqps.Load()), func(q *QueuePair) bool { return q == qp })
	cq.sqps.Store(&next)
	cq.mu.Unlock()
}

func (cq *CompletionQueue) pending() bool { return cq.n.Load() > 0 }

// push queues a completion and wakes a waiter.
func (cq *CompletionQueue) push(c *Completion) {
	cq.mu.Lock()
	cq.q = append(cq.q, *c)
	cq.n.Add(1)
	cq.mu.Unlock()
	cq.ws.Ring()
}

// attach makes cq drive qp's receives.
func (cq *CompletionQueue) attach(qp *QueuePair) {
	cq.mu.Lock()
	old := *cq.qps.Load()
	next := append(slices.Clip(old), qp)
	cq.qps.Store(&next)
	cq.mu.Unlock()
	cq.dirty.Store(true)
	cq.ws.Ring()
}

// detach stops cq driving qp and returns only when no waiter can touch
// qp's ring any more, so the caller may unmap it.
func (cq *CompletionQueue) detach(qp *QueuePair) {
	cq.mu.Lock()
	old := *cq.qps.Load()
	next := slices.DeleteFunc(slices.Clone(old), func(q *QueuePair) bool { return q == qp })
	cq.qps.Store(&next)
	cq.mu.Unlock()
	cq.dirty.Store(true)
	cq.ws.Ring()
	cq.waitMu.Lock() // a waiter returns from its sleep once rung
	cq.syncWaitSet()
	cq.waitMu.Unlock()
}

// syncWaitSet rebuilds ws from qps. The caller holds waitMu.
func (cq *CompletionQueue) syncWaitSet() {
	if !cq.dirty.Swap(false) {
		return
	}
	for _, qp := range cq.wsQPs {
		cq.ws.Remove(qp.in)
	}
	cq.wsQPs = append(cq.wsQPs[:0], *cq.qps.Load()...)
	for _, qp := range cq.wsQPs {
		cq.ws.Add(qp.in)
	}
}

// Wake makes a Wait that is sleeping or spinning now, or the next one,
// return early (with no completion and no error) — for code of this
// process that must interrupt a waiter, a closing connection say.
func (cq *CompletionQueue) Wake() {
	cq.woken.Store(true)
	cq.ws.Ring()
}

// Poll moves incoming sends into posted receives, then copies up to
// len(out) completions into out and returns how many. It never blocks on
// the peer.
func (cq *CompletionQueue) Poll(out []Completion) int {
	got := 0
	for _, qp := range *cq.qps.Load() {
		got += qp.progressRecvInto(out[got:])
	}
	for _, qp := range *cq.sqps.Load() {
		if qp.sqLen.Load() > 0 {
			qp.engineTurn(true)
		}
	}
	if cq.n.Load() == 0 || got == len(out) {
		return got // the common case of a busy poller: no lock taken
	}
	cq.mu.Lock()
	n := min(len(out)-got, len(cq.q)-cq.hd)
	for i := range n {
		c := &cq.q[cq.hd+i]
		out[got+i] = *c
		*c = Completion{} // drop references to QPs and errors
	}
	cq.hd += n
	if cq.hd == len(cq.q) {
		cq.q, cq.hd = cq.q[:0], 0
	}
	cq.n.Add(int32(-n))
	cq.mu.Unlock()
	return got + n
}

// leaveWork hands the queued work of this CQ's queue pairs back to the
// engine before a waiter sleeps: the engine would otherwise leave it to
// the poller for engineYield more.
func (cq *CompletionQueue) leaveWork() {
	for _, qp := range *cq.sqps.Load() {
		if qp.sqLen.Load() > 0 && qp.polledAt.Load() != 0 {
			qp.polledAt.Store(0)
			qp.dev.eng.wake()
		}
	}
}

// Wait is Poll that waits, as the device's wait configuration says, until
// at least one completion is there, deadline passes (zero: no deadline;
// then os.ErrDeadlineExceeded), or Wake is called (then it returns 0 and
// no error).
func (cq *CompletionQueue) Wait(out []Completion, deadline time.Time) (int, error) {
	if n := cq.Poll(out); n > 0 || len(out) == 0 {
		return n, nil
	}
	if cq.wait.Mode != shm.WaitBlock {
		var spinEnd time.Time
		if cq.wait.Mode == shm.WaitAdaptive {
			spinEnd = time.Now().Add(cq.wait.Spin)
		}
		for i := 1; ; i++ {
			if n := cq.Poll(out); n > 0 {
				return n, nil
			}
			// Load first: a swap is a locked instruction, too dear for
			// every turn of the spin.
			if cq.woken.Load() && cq.woken.Swap(false) {
				return 0, nil
			}
			if i%64 == 0 && (!deadline.IsZero() || cq.wait.Mode == shm.WaitAdaptive) {
				now := time.Now()
				if !deadline.IsZero() && now.After(deadline) {
					return 0, os.ErrDeadlineExceeded
				}
				if cq.wait.Mode == shm.WaitAdaptive && now.After(spinEnd) {
					break
				}
			}
		}
	}
	for {
		cq.leaveWork()
		cq.waitMu.Lock()
		cq.syncWaitSet()
		err := cq.ws.Wait(cq.ready, deadline)
		cq.waitMu.Unlock()
		if n := cq.Poll(out); n > 0 {
			return n, nil
		}
		if cq.woken.Swap(false) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
	}
}
