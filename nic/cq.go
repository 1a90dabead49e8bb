package nic

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
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
	dev *Device

	// Completions go into ring, without a lock, and into q, under mu,
	// when ring is full or q holds some already (over): a queue pair's
	// completions, pushed one after another, never overtake each other.
	// A poll takes ring's, then q's.
	ring cqRing
	over atomic.Bool    // q holds completions: pushes go there too
	mu   lockrank.Mutex // guards q, hd, over's changes; never held while calling into a QP
	q    []Completion
	hd   int

	qps   atomic.Pointer[[]*QueuePair] // QPs whose receives this CQ drives; copy on write
	sqps  atomic.Pointer[[]*QueuePair] // QPs whose queued send work this CQ's pollers run; copy on write
	dirty atomic.Bool                  // qps changed since the waiter built ws
	woken atomic.Bool                  // Wake was called: the next Wait returns early
	// waiter is what a Wait parks on: taken from the device's hub at the
	// first Wait that parks, given back by Close. Peers wake it through
	// the rings' doorbells, this process through wakeWaiter.
	waiter atomic.Pointer[shm.Waiter]

	waitMu lockrank.Mutex // serializes waiters; guards ws, wsQPs, strat, look
	ws     shm.WaitSet
	wsQPs  []*QueuePair
	strat  shm.WaitStrategy
	look   cqWait
	closed bool
}

// NewCQ creates a completion queue.
func (d *Device) NewCQ() *CompletionQueue { return newCQ(d, d.cfg.Wait) }

// newCQ is NewCQ for device d (nil in tests of the queue alone: such a CQ
// is pushed to and polled, never waited on).
func newCQ(d *Device, wait shm.WaitConfig) *CompletionQueue {
	cq := &CompletionQueue{dev: d, strat: shm.NewWaitStrategy(wait)}
	cq.mu.Init(lockrank.CQ)
	cq.ring.init()
	cq.waitMu.Init(lockrank.CQWait)
	cq.qps.Store(new([]*QueuePair))
	cq.sqps.Store(new([]*QueuePair))
	cq.look.cq = cq
	return cq
}

// SetWait makes the CQ's Waits wait as cfg says instead of as the
// device's configuration does. Call it before the CQ is waited on.
func (cq *CompletionQueue) SetWait(cfg shm.WaitConfig) {
	cq.waitMu.Lock()
	cq.strat = shm.NewWaitStrategy(cfg)
	cq.waitMu.Unlock()
}

// Close gives the completion queue's waiter back to the device. Call it
// once no queue pair uses the CQ; a Wait after Close polls with naps.
func (cq *CompletionQueue) Close() {
	cq.waitMu.Lock()
	cq.closed = true
	if w := cq.waiter.Swap(nil); w != nil {
		w.Close()
	}
	cq.waitMu.Unlock()
}

// wakeWaiter wakes a Wait that parks (or is about to).
func (cq *CompletionQueue) wakeWaiter() {
	if w := cq.waiter.Load(); w != nil {
		w.Wake()
	}
}

// waiterLocked returns the CQ's waiter, taking one from the hub the first
// time (nil: none to be had, or closed; Wait then naps). The caller holds
// waitMu.
func (cq *CompletionQueue) waiterLocked() *shm.Waiter {
	if w := cq.waiter.Load(); w != nil || cq.closed {
		return w
	}
	w, err := cq.dev.hub.NewWaiter()
	if err != nil {
		return nil
	}
	cq.waiter.Store(w)
	return w
}

// cqWait is a Wait in progress: what it looks at and what it found.
type cqWait struct {
	cq      *CompletionQueue
	out     []Completion
	n       int
	armed   bool // announced: Ready only looks, it does not poll
	inPlace bool // an in-place queue pair has something for its owner
}

// Ready polls once; announced, about to park, it only looks (a poll would
// take back the queued work Arm handed to the engine). It also ends the
// wait when the set of queue pairs changed or Wake was called.
func (w *cqWait) Ready() bool {
	cq := w.cq
	if cq.dirty.Load() || cq.woken.Load() {
		return true
	}
	if !w.armed {
		if w.n = cq.Poll(w.out); w.n > 0 {
			return true
		}
	} else if cq.pending() {
		return true
	}
	for _, qp := range cq.wsQPs {
		if qp.inPlace {
			// The owner waits here, and it alone moves the ring.
			if qp.RecvPending() {
				w.inPlace = true
				return true
			}
		} else if w.armed && qp.recvPending() {
			return true
		}
	}
	return false
}

// Arm announces the waiter on every incoming ring. Before it sleeps it
// gives back the ring space that pollers' lazy releases held, and the
// queued work pollers kept from the engine.
func (w *cqWait) Arm(bell uint32) {
	cq := w.cq
	cq.ws.Arm(bell)
	w.armed = bell != 0
	if w.armed {
		for _, qp := range cq.wsQPs {
			qp.releaseLazy()
		}
		cq.leaveWork()
	}
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

func (cq *CompletionQueue) pending() bool { return cq.ring.ready() || cq.over.Load() }

// push queues a completion and wakes a waiter.
func (cq *CompletionQueue) push(c *Completion) {
	if cq.over.Load() || !cq.ring.push(c) {
		cq.pushLocked(c)
	}
	cq.wakeWaiter()
}

// pushLocked is push's way when the ring is full or completions wait in
// q: q, behind them, unless q emptied meanwhile and the ring has room.
func (cq *CompletionQueue) pushLocked(c *Completion) {
	cq.mu.Lock()
	if cq.over.Load() || !cq.ring.push(c) {
		cq.q = append(cq.q, *c)
		cq.over.Store(true)
	}
	cq.mu.Unlock()
}

// attach makes cq drive qp's receives.
func (cq *CompletionQueue) attach(qp *QueuePair) {
	cq.mu.Lock()
	old := *cq.qps.Load()
	next := append(slices.Clip(old), qp)
	cq.qps.Store(&next)
	cq.mu.Unlock()
	cq.dirty.Store(true)
	cq.wakeWaiter()
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
	cq.wakeWaiter()
	cq.waitMu.Lock() // a waiter returns from its wait once woken
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
	cq.wakeWaiter()
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
	got += cq.ring.popInto(out[got:])
	if h := testHookPolledRing.Load(); h != nil {
		(*h)()
	}
	if !cq.over.Load() || got == len(out) {
		return got // no lock taken
	}
	cq.mu.Lock()
	// The ring's completions first: each was pushed before q's of the
	// same queue pair (a push that found q in use queued behind it).
	got += cq.ring.popInto(out[got:])
	n := min(len(out)-got, len(cq.q)-cq.hd)
	for i := range n {
		c := &cq.q[cq.hd+i]
		out[got+i] = *c
		*c = Completion{} // drop references to QPs and errors
	}
	cq.hd += n
	if cq.hd == len(cq.q) {
		cq.q, cq.hd = cq.q[:0], 0
		cq.over.Store(false) // the ring takes pushes again
	}
	cq.mu.Unlock()
	return got + n
}

// testHookPolledRing, when set, runs in Poll between its look at the ring
// and its look at the overflow.
var testHookPolledRing atomic.Pointer[func()]

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
// no error), or an in-place queue pair of the CQ has something for its
// owner (then it returns 0 and no error too: RecvInPlace takes it). A
// goroutine that has to sleep parks in the Go scheduler
// (shm.WaitStrategy); it never blocks a thread.
func (cq *CompletionQueue) Wait(out []Completion, deadline time.Time) (int, error) {
	n, _, err := cq.WaitOutcome(out, deadline)
	return n, err
}

// WaitOutcome is Wait that also tells how the wait ended: at the first
// look, while spinning, or after parking.
func (cq *CompletionQueue) WaitOutcome(out []Completion, deadline time.Time) (int, shm.Outcome, error) {
	return cq.waitOutcome(out, deadline, false)
}

// WaitParkedOutcome is WaitOutcome that parks without spinning first,
// whatever the CQ's configuration: for a wait whose answer needs the peer
// to do more than a spin lasts.
func (cq *CompletionQueue) WaitParkedOutcome(out []Completion, deadline time.Time) (int, shm.Outcome, error) {
	return cq.waitOutcome(out, deadline, true)
}

// parkAtOnce is WaitParkedOutcome's strategy. A block-mode strategy keeps
// no state, so one serves every CQ.
var parkAtOnce = shm.NewWaitStrategy(shm.WaitConfig{Mode: shm.WaitBlock})

func (cq *CompletionQueue) waitOutcome(out []Completion, deadline time.Time, parked bool) (int, shm.Outcome, error) {
	if n := cq.Poll(out); n > 0 || len(out) == 0 {
		return n, shm.WaitedReady, nil
	}
	if cq.woken.Swap(false) {
		return 0, shm.WaitedReady, nil
	}
	cq.waitMu.Lock()
	cq.syncWaitSet()
	cq.look.out, cq.look.n, cq.look.inPlace = out, 0, false
	w := cq.waiterLocked()
	var err error
	how := shm.WaitedReady
	strat := &cq.strat
	if parked {
		strat = &parkAtOnce
	}
	for cq.look.n == 0 && !cq.look.inPlace && err == nil && !cq.dirty.Load() && !cq.woken.Load() {
		// A wait that ends on a look, not a poll, polls again.
		var o shm.Outcome
		o, err = strat.Wait(&cq.look, w, deadline)
		how = max(how, o)
	}
	n := cq.look.n
	cq.look.out = nil
	cq.waitMu.Unlock()
	switch {
	case n > 0:
		return n, how, nil
	case cq.woken.Swap(false):
		return 0, how, nil
	}
	return 0, how, err // nil: the set changed; the caller looks again
}
