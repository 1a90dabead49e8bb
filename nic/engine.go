package nic

import "sync"

// engine is a device's background executor: it runs queued work requests
// chunk by chunk, round-robin over queue pairs.
type engine struct {
	mu      sync.Mutex // guards ready, stopped
	cond    sync.Cond
	ready   []*QueuePair
	stopped bool
	done    chan struct{}
}

func newEngine(d *Device) *engine {
	e := &engine{done: make(chan struct{})}
	e.cond.L = &e.mu
	go e.run()
	return e
}

// add puts qp on the engine's list. The caller holds qp.sqMu and has set
// qp.queued.
func (e *engine) add(qp *QueuePair) {
	e.mu.Lock()
	e.ready = append(e.ready, qp)
	e.mu.Unlock()
	e.cond.Signal()
}

func (e *engine) run() {
	defer close(e.done)
	for {
		e.mu.Lock()
		for len(e.ready) == 0 && !e.stopped {
			e.cond.Wait()
		}
		if e.stopped {
			e.mu.Unlock()
			return
		}
		qp := e.ready[0]
		e.ready[0] = nil
		e.ready = e.ready[1:]
		e.mu.Unlock()
		if qp.engineTurn() {
			e.mu.Lock()
			e.ready = append(e.ready, qp)
			e.mu.Unlock()
		}
	}
}

func (e *engine) stop() {
	e.mu.Lock()
	e.stopped = true
	e.mu.Unlock()
	e.cond.Broadcast()
	<-e.done
}
