package shm

import (
	"errors"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitSet(t *testing.T) {
	p1, c1 := newRing(t, 4096, WaitConfig{}, WaitConfig{})
	p2, c2 := newRing(t, 4096, WaitConfig{}, WaitConfig{})
	var w WaitSet
	w.Add(c1)
	w.Add(c2)
	never := func() bool { return false }
	if err := w.Wait(never, time.Now().Add(10*time.Millisecond)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	if err := w.Wait(never, time.Now().Add(-time.Second)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past deadline: %v", err)
	}
	var local atomic.Bool
	wakers := []struct {
		name string
		wake func()
	}{
		{"second ring", func() { p2.Write(0, []byte("x"), time.Time{}) }},
		{"first ring", func() { p1.Write(0, []byte("y"), time.Time{}) }},
		{"bell", func() { local.Store(true); w.Ring() }},
		{"close", func() { p1.Close() }},
	}
	ready := func() bool { return local.Load() || c1.Pending() || c2.Pending() }
	for _, wk := range wakers {
		t.Run(wk.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				for {
					// Return once something is pending.
					if ready() {
						done <- nil
						return
					}
					if err := w.Wait(ready, time.Now().Add(20*time.Second)); err != nil {
						done <- err
						return
					}
				}
			}()
			wk.wake()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("WaitSet not woken")
			}
			// Consume what woke us so the next case starts idle.
			for _, c := range []*Consumer{c1, c2} {
				if _, ok, _ := c.Poll(); ok {
					c.Release()
				}
			}
		})
	}
	w.Remove(c1)
	w.Remove(c2)
	if len(w.cs) != 0 {
		t.Fatalf("Remove left %d", len(w.cs))
	}
}

// TestWaitSetOneRing: a set of one ring sleeps on that ring's doorbell
// alone (plain FUTEX_WAIT), and Ring, a commit and a close each wake it
// once it has announced itself; Remove forgets the word.
func TestWaitSetOneRing(t *testing.T) {
	p, c := newRing(t, 4096, WaitConfig{}, WaitConfig{})
	var w WaitSet
	w.Add(c)
	var local atomic.Bool
	ready := func() bool { return local.Load() || c.Pending() }
	for _, wk := range []struct {
		name string
		wake func()
	}{
		{"bell", func() { local.Store(true); w.Ring() }},
		{"commit", func() { p.Write(0, []byte("x"), time.Time{}) }},
		{"close", func() { p.Close() }},
	} {
		t.Run(wk.name, func(t *testing.T) {
			local.Store(false)
			done := make(chan error, 1)
			go func() {
				deadline := time.Now().Add(20 * time.Second)
				for !ready() {
					if err := w.Wait(ready, deadline); err != nil {
						done <- err
						return
					}
				}
				if time.Now().After(deadline) {
					done <- errors.New("woken by the deadline, not by the wake-up")
					return
				}
				done <- nil
			}()
			// Wake only once the waiter has announced itself on both words
			// (it is asleep, or about to be and will see the change).
			for w.bell.Load() == 0 || load32(c.cBell) == 0 {
				select {
				case err := <-done:
					t.Fatalf("Wait returned before anything happened: %v", err)
				default:
					runtime.Gosched()
				}
			}
			if got := w.one.Load(); got != c.cBell {
				t.Fatalf("one ring: the waiter sleeps on %p, want the ring's doorbell %p", got, c.cBell)
			}
			wk.wake()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if _, ok, _ := c.Poll(); ok {
				c.Release()
			}
		})
	}
	w.Remove(c)
	if w.one.Load() != nil {
		t.Fatal("Remove kept the ring's doorbell")
	}
}
