package nic

import (
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
)

// engine is a device's background executor: it runs queued work requests
// chunk by chunk, round-robin over queue pairs.
//
// Pollers of a send CQ run their queue pairs' queued work themselves
// (CompletionQueue.Poll), and while they do, the engine keeps off those
// queue pairs: a queue pair whose last chunk a poller ran less than
// engineYield ago is put aside and looked at again engineYield later. Both
// taking turns meant that chunks alternated between the poller's CPU and
// the engine's, each pulling the buffers over from the other's caches
// (docs/performance.md).
// This is how UCX and libfabric's shm provider progress too — in the
// caller's thread, as it polls; the engine is for work nobody polls for.
type engine struct {
	mu      lockrank.Mutex // guards ready, aside, stopped and every QueuePair.inEngine
	ready   []*QueuePair
	aside   []*QueuePair // yielded to pollers: looked at again later
	stopped bool
	kick    chan struct{} // a queue pair was added, or stop
	done    chan struct{}
}

// engineYield is how long after a poller's turn the engine leaves a queue
// pair to its pollers: longer than the gap between a busy poller's turns,
// short next to a wait's spin. A variable for tests only. While pollers
// keep their queue pairs, the engine looks again after engineYield, then
// twice as long each time, up to engineYieldMax: every look wakes a
// thread, which on a machine whose CPUs spin for the application takes
// one of them from it. A poller that goes to sleep hands its work back at
// once (CompletionQueue.Wait), so the longer looks only delay the work of
// a poller that stopped polling without sleeping.
var engineYield = 50 * time.Microsecond

const engineYieldMax = time.Millisecond

func newEngine(d *Device) *engine {
	e := &engine{kick: make(chan struct{}, 1), done: make(chan struct{})}
	e.mu.Init(lockrank.Engine)
	go e.run()
	return e
}

// add puts qp on the engine's list. The caller holds qp.sqMu and has set
// qp.queued.
func (e *engine) add(qp *QueuePair) {
	e.mu.Lock()
	// Once on a list: the engine may still hold a queue pair whose work a
	// poller finished (aside, for as long as the poller polls); a second
	// copy for each new batch of work would pile up there.
	if !qp.inEngine {
		qp.inEngine = true
		e.ready = append(e.ready, qp)
	}
	e.mu.Unlock()
	e.wake()
}

func (e *engine) wake() {
	select {
	case e.kick <- struct{}{}:
	default: // a kick is pending already
	}
}

func (e *engine) run() {
	defer close(e.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	backoff := engineYield
	for {
		e.mu.Lock()
		if e.stopped {
			e.mu.Unlock()
			return
		}
		var qp *QueuePair
		if len(e.ready) > 0 {
			qp = e.ready[0]
			e.ready[0] = nil
			e.ready = e.ready[1:]
		}
		waiting := len(e.aside) > 0
		e.mu.Unlock()
		if qp == nil {
			if !waiting {
				<-e.kick
				continue
			}
			timer.Reset(backoff)
			select {
			case <-e.kick:
				timer.Stop()
			case <-timer.C:
				backoff = min(2*backoff, max(engineYieldMax, engineYield))
			}
			e.mu.Lock()
			e.ready = append(e.ready, e.aside...)
			clear(e.aside)
			e.aside = e.aside[:0]
			e.mu.Unlock()
			continue
		}
		more, yielded := qp.engineTurn(false)
		if !yielded {
			backoff = engineYield
		}
		e.mu.Lock()
		switch {
		case yielded:
			e.aside = append(e.aside, qp)
		case more:
			e.ready = append(e.ready, qp)
		default:
			qp.inEngine = false
		}
		e.mu.Unlock()
		if !more && !yielded && qp.sqLen.Load() > 0 {
			// Work queued after the turn looked, whose add found the
			// queue pair still ours.
			e.add(qp)
		}
	}
}

func (e *engine) stop() {
	e.mu.Lock()
	e.stopped = true
	e.mu.Unlock()
	e.wake()
	<-e.done
}
