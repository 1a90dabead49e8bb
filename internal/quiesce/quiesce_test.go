package quiesce

import (
	"sync"
	"testing"
	"time"
)

// TestWaitsForHolders: a critical section under each lock is in progress
// when Wait is called; Wait returns only after both ended, so what they
// wrote is visible to it (the race detector sees the order, whatever the
// scheduling).
func TestWaitsForHolders(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold []int // the locks held when Wait is called
	}{
		{"first", []int{0}},
		{"second", []int{1}},
		{"both", []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mus [2]sync.Mutex
			var wrote [2]int
			in, release := make(chan struct{}), make(chan struct{})
			for _, i := range tc.hold {
				go func() {
					mus[i].Lock()
					in <- struct{}{}
					<-release
					wrote[i] = 1
					mus[i].Unlock()
				}()
				<-in
			}
			done := make(chan [2]int)
			go func() {
				Wait(&mus[0], &mus[1])
				done <- wrote
			}()
			close(release)
			select {
			case got := <-done:
				for _, i := range tc.hold {
					if got[i] != 1 {
						t.Errorf("Wait returned before the critical section under lock %d ended", i)
					}
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Wait did not return after the holders released their locks")
			}
			// Wait left the locks free.
			for i := range mus {
				if !mus[i].TryLock() {
					t.Errorf("lock %d still held after Wait", i)
				}
			}
		})
	}
}

// TestReaders: with a read lock's Locker, Wait waits for writers only and
// runs beside other readers; with nothing to wait for it returns.
func TestReaders(t *testing.T) {
	Wait()
	var rw sync.RWMutex
	rw.RLock()
	Wait(rw.RLocker()) // another reader holds it: no wait
	rw.RUnlock()
	if !rw.TryLock() {
		t.Error("read lock still held after Wait")
	}
}
