package shm

import (
	"errors"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// setWait parks on a WaitSet's rings and on in-process work (local).
type setWait struct {
	ws    *WaitSet
	local *atomic.Bool
}

func (s setWait) Ready() bool {
	if s.local.Load() {
		return true
	}
	for _, c := range s.ws.cs {
		if c.Pending() {
			return true
		}
	}
	return false
}

func (s setWait) Arm(bell uint32) { s.ws.Arm(bell) }

// TestWaitSet: a goroutine parked on a set of two rings is woken by a
// commit on either ring, by a close and by an in-process Wake, each only
// once it has announced itself on both doorbells; Remove withdraws the
// announcement and forgets the ring.
func TestWaitSet(t *testing.T) {
	p1, c1 := newRing(t, 4096, WaitConfig{}, WaitConfig{})
	p2, c2 := newRing(t, 4096, WaitConfig{}, WaitConfig{})
	h := newHub(t)
	w := newWaiter(t, h)
	// The producers wake through this hub, where w lives.
	p1.SetWake(nil, h.Notifier())
	p2.SetWake(nil, h.Notifier())
	var ws WaitSet
	ws.Add(c1)
	ws.Add(c2)
	var local atomic.Bool
	x := setWait{&ws, &local}
	strat := NewWaitStrategy(WaitConfig{Mode: WaitBlock})
	if _, err := strat.Wait(x, w, time.Now().Add(10*time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("nothing happened: %v", err)
	}
	for _, wk := range []struct {
		name string
		wake func()
	}{
		{"second ring", func() { p2.Write(0, []byte("x"), time.Time{}) }},
		{"first ring", func() { p1.Write(0, []byte("y"), time.Time{}) }},
		{"local", func() { local.Store(true); w.Wake() }},
		{"close", func() { p1.Close() }},
	} {
		t.Run(wk.name, func(t *testing.T) {
			local.Store(false)
			done := make(chan error, 1)
			deadline := time.Now().Add(20 * time.Second)
			go func() {
				_, err := strat.Wait(x, w, deadline)
				if err == nil && time.Now().After(deadline) {
					err = errors.New("woken by the deadline, not by the wake-up")
				}
				done <- err
			}()
			// Wake only once the waiter has announced itself on both
			// doorbells and is parked (or about to be: it will see it).
			for load32(c1.cBell) != w.Bell() || load32(c2.cBell) != w.Bell() || w.sleeping.Load() == 0 {
				select {
				case err := <-done:
					t.Fatalf("Wait returned before anything happened: %v", err)
				default:
					runtime.Gosched()
				}
			}
			wk.wake()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if load32(c1.cBell) != 0 || load32(c2.cBell) != 0 {
				t.Fatal("the announcement outlived the wait")
			}
			for _, c := range []*Consumer{c1, c2} {
				if _, ok, _ := c.Poll(); ok {
					c.Release()
				}
			}
		})
	}
	store32(c2.cBell, 7)
	ws.Remove(c1)
	ws.Remove(c2)
	if ws.Len() != 0 || load32(c2.cBell) != 0 {
		t.Fatalf("Remove left %d rings, doorbell %d", ws.Len(), load32(c2.cBell))
	}
}
