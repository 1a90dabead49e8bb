//go:build lockrank

package lockrank

import (
	"strings"
	"testing"
)

// mustPanic runs lock, which must panic with a lock-order violation that
// is then the last one recorded, naming held and taken.
func mustPanic(t *testing.T, held, taken Rank, lock func()) {
	t.Helper()
	n := len(Violations())
	func() {
		defer func() {
			r := recover()
			if s, _ := r.(string); !strings.Contains(s, "lock order") {
				t.Fatalf("Lock out of order: recovered %v, want a lock-order panic", r)
			}
		}()
		lock()
	}()
	vs := Violations()
	if len(vs) != n+1 {
		t.Fatalf("%d violations recorded, want %d", len(vs), n+1)
	}
	v := vs[n]
	if v.Held != held || v.Taken != taken || !strings.Contains(v.Stack, "TestOutOfOrder") {
		t.Errorf("violation %+v, want %v held, %v taken, with the stack", v, held, taken)
	}
}

// TestOutOfOrder: a lower rank taken under a higher one, and a rank taken
// under the same rank, are recorded and panic before they can block.
func TestOutOfOrder(t *testing.T) {
	var hi, lo, same Mutex
	var rw RWMutex
	hi.Init(NICDevice)
	lo.Init(PinCache)
	same.Init(NICDevice)
	rw.Init(PinOwned)
	hi.Lock()
	mustPanic(t, NICDevice, PinCache, lo.Lock)
	mustPanic(t, NICDevice, NICDevice, same.Lock)
	mustPanic(t, NICDevice, PinOwned, rw.RLock)
	hi.Unlock()
	// Nothing held now: the same locks in order pass.
	lo.Lock()
	hi.Lock()
	critical++
	hi.Unlock()
	lo.Unlock()
	rw.RLock()
	mustPanic(t, PinOwned, PinOwned, rw.RLock)
	rw.RUnlock()
}

// TestUnlockByAnother: a lock released by another goroutine is no longer
// held by the one that took it.
func TestUnlockByAnother(t *testing.T) {
	var hi, lo Mutex
	hi.Init(Hub)
	lo.Init(ConnRecv)
	hi.Lock()
	done := make(chan struct{})
	go func() {
		hi.Unlock()
		close(done)
	}()
	<-done
	n := len(Violations())
	lo.Lock()
	critical++
	lo.Unlock()
	if len(Violations()) != n {
		t.Fatal("a lock released by another goroutine still counted as held")
	}
}
