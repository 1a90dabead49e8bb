package shm

import (
	"errors"
	"os"
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
	if err := w.Wait(nil, time.Now().Add(10*time.Millisecond)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	if err := w.Wait(nil, time.Now().Add(-time.Second)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past deadline: %v", err)
	}
	var local atomic.Bool
	wakers := []struct {
		name  string
		wake  func()
		ready func() bool
	}{
		{"second ring", func() { p2.Write(0, []byte("x"), time.Time{}) }, nil},
		{"first ring", func() { p1.Write(0, []byte("y"), time.Time{}) }, nil},
		{"bell", func() { local.Store(true); w.Ring() }, local.Load},
		{"close", func() { p1.Close() }, nil},
	}
	for _, wk := range wakers {
		t.Run(wk.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				for {
					// Return once something is pending.
					if (wk.ready != nil && wk.ready()) || c1.pending() || c2.pending() {
						done <- nil
						return
					}
					if err := w.Wait(wk.ready, time.Now().Add(20*time.Second)); err != nil {
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
