package sockets

import (
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
)

// deadline is one direction's deadline, after net/pipe.go's pipeDeadline:
// a timer closes cancel when the deadline passes, and setting a new
// deadline replaces a closed cancel channel. expired mirrors "cancel is
// closed" for a lock-free check on the hot path.
type deadline struct {
	mu      lockrank.Mutex // guards t, timer, cancel; a leaf
	t       time.Time
	timer   *time.Timer
	cancel  chan struct{}
	expired atomic.Bool
	isSet   atomic.Bool // t is not zero
}

// init makes d a deadline that is not set; it is called once, before d
// is used.
func (d *deadline) init() {
	d.mu.Init(lockrank.Deadline)
	d.cancel = make(chan struct{})
}

// set sets the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // wait for the timer callback to finish and close cancel
	}
	d.timer = nil
	d.t = t
	d.isSet.Store(!t.IsZero())
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
			d.expired.Store(false)
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
			d.expired.Store(false)
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() {
			d.expired.Store(true)
			close(cancel)
		})
		return
	}
	if !closed {
		d.expired.Store(true)
		close(d.cancel)
	}
}

// wait returns a channel closed when the deadline passes.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

// when returns the deadline (zero: none).
func (d *deadline) when() time.Time {
	if !d.isSet.Load() {
		return time.Time{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.t
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
