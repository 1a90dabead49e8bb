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
