package lockrank

import (
	"strings"
	"sync"
	"testing"
)

// Both kinds satisfy sync.Locker, for quiesce.Wait and sync.Cond.
var (
	_ sync.Locker = (*Mutex)(nil)
	_ sync.Locker = (*RWMutex)(nil)
)

// critical is what the tests' critical sections change.
var critical int

// TestInOrder: locks taken in rank order, released in any order, and an
// unranked lock anywhere pass, with the tag or without.
func TestInOrder(t *testing.T) {
	var a, b, c, free Mutex
	var rw RWMutex
	a.Init(ConnLend)
	b.Init(ConnRecv)
	c.Init(Hub)
	rw.Init(PinOwned)
	for range 2 {
		a.Lock()
		free.Lock()
		b.Lock()
		rw.RLock()
		c.Lock()
		b.Unlock() // out of order
		rw.RUnlock()
		c.Unlock()
		free.Unlock()
		a.Unlock()
	}
	rw.Lock()
	c.Lock()
	critical++
	c.Unlock()
	rw.Unlock()
	if v := Violations(); len(v) != 0 {
		t.Fatalf("violations in order: %v", v)
	}
}

// TestRankNames: the ranks are named as docs/locking.md names the locks.
func TestRankNames(t *testing.T) {
	if got := ConnLend.String(); got != "sockets.Conn.lendMu (rank 5)" {
		t.Errorf("ConnLend.String() = %q", got)
	}
	if got := StatsReader.String(); got != "stats.Reader.mu (rank 93)" {
		t.Errorf("StatsReader.String() = %q", got)
	}
	if got := Rank(99).String(); got != "rank 99" {
		t.Errorf("Rank(99).String() = %q", got)
	}
	v := Violation{Held: Hub, Taken: ConnRecv, Stack: "stack"}
	if s := v.String(); !strings.Contains(s, "sockets.Conn.mu.recv (rank 20) taken while holding shm.Hub.mu (rank 80)") {
		t.Errorf("Violation.String() = %q", s)
	}
}
