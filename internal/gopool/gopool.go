// Package gopool runs the short background work of a connection — a
// listener's handshake, a queue pair's socket reader, a teardown — on a
// goroutine that earlier work left idle, instead of on a new one.
//
// A program that dials per request made five goroutines a connection
// between its two processes. Each began on a small stack that the work
// grew, copying it (the runtime's copystack), and each start readied a
// goroutine on an idle processor. An idle worker keeps the stack it grew
// and is woken the same way a new goroutine would be: the connection's
// set-up and teardown cost less CPU (docs/setup.md, "Goroutines kept for
// the next connection").
//
// At most maxIdle workers wait at a time, each for at most a second;
// then they exit. A task runs as it would with go: a panic in it ends
// the program. In a goroutine dump a task shows under gopool.worker, and
// "created by" names whichever task first started its worker.
package gopool

import (
	"sync/atomic"
	"time"
)

// maxIdle bounds the workers that wait for work: after a burst of
// connections closing at once, the rest exit instead of keeping their
// stacks.
const maxIdle = 64

var (
	// work hands a task to a waiting worker; unbuffered, so that a send
	// goes through only when one waits.
	work = make(chan func())
	// idle counts the workers waiting on work.
	idle atomic.Int32
	// linger is how long an idle worker waits for its next task, in
	// nanoseconds (a variable for the package's tests).
	linger atomic.Int64
)

func init() {
	linger.Store(int64(time.Second))
}

// Go runs f on a worker goroutine: an idle one when one waits, else a new
// one. It does not wait for f.
func Go(f func()) {
	select {
	case work <- f:
	default:
		go worker(f)
	}
}

// Idle returns how many workers are waiting for work: goroutines that a
// count of the program's goroutines includes while no task runs.
func Idle() int {
	return int(idle.Load())
}

func worker(f func()) {
	var t *time.Timer
	for {
		f()
		f = nil // nothing of the task stays reachable while idle
		if idle.Add(1) > maxIdle {
			idle.Add(-1)
			return
		}
		d := time.Duration(linger.Load())
		if t == nil {
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		select {
		case f = <-work:
			idle.Add(-1)
		case <-t.C:
			idle.Add(-1)
			return
		}
	}
}
