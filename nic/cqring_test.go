package nic

import (
	"sync"
	"testing"

	"github.com/sandirect/sandirect/shm"
)

// TestCQOrderThroughOverflow pushes more completions than the lock-free
// ring holds, polls them in small batches while pushing more, and checks
// that they come out once each and in the order pushed: through the ring,
// the overflow behind it, and back to the ring once the overflow drains.
func TestCQOrderThroughOverflow(t *testing.T) {
	cq := newCQ(nil, shm.WaitConfig{})
	next, want := uint64(0), uint64(0)
	push := func(k int) {
		for range k {
			cq.push(&Completion{ID: next, Status: StatusSuccess})
			next++
		}
	}
	poll := func(batch int) int {
		out := make([]Completion, batch)
		n := cq.Poll(out)
		for _, c := range out[:n] {
			if c.ID != want {
				t.Fatalf("completion %d came when %d was due", c.ID, want)
			}
			want++
		}
		return n
	}
	push(3 * cqSlots) // two rings' worth overflows
	if !cq.over.Load() {
		t.Fatal("no overflow after pushing three rings' worth")
	}
	for round := 0; want < next; round++ {
		poll(5)
		if round%2 == 0 {
			push(3) // pushes while the overflow drains go behind it
		}
		if round > 10*cqSlots {
			t.Fatalf("stuck at %d of %d", want, next)
		}
	}
	if cq.over.Load() || len(cq.q) != 0 {
		t.Fatalf("overflow still in use after draining: over %v, %d queued", cq.over.Load(), len(cq.q)-cq.hd)
	}
	push(cqSlots / 2) // the ring again
	if cq.over.Load() {
		t.Fatal("pushes after the overflow drained went to it")
	}
	for poll(7) > 0 {
	}
	if want != next {
		t.Fatalf("polled %d of %d", want, next)
	}
	if cq.pending() {
		t.Fatal("pending with nothing queued")
	}
}

// TestCQRingBeforeOverflowInOnePoll fills the ring and starts the overflow
// between a poll's look at the ring (empty) and its look at the overflow:
// the poll must hand out the ring's completions, which came first, before
// the overflow's.
func TestCQRingBeforeOverflowInOnePoll(t *testing.T) {
	cq := newCQ(nil, shm.WaitConfig{})
	hook := func() {
		for i := range uint64(cqSlots + 1) {
			cq.push(&Completion{ID: i, Status: StatusSuccess})
		}
	}
	testHookPolledRing.Store(&hook)
	out := make([]Completion, 2*cqSlots)
	n := cq.Poll(out)
	testHookPolledRing.Store(nil)
	if n != cqSlots+1 {
		t.Fatalf("polled %d completions, want %d", n, cqSlots+1)
	}
	for i, c := range out[:n] {
		if c.ID != uint64(i) {
			t.Fatalf("completion %d came as number %d", c.ID, i)
		}
	}
}

// TestCQConcurrent has pushers and pollers race through the ring and its
// overflow (run it under -race): every completion arrives exactly once,
// and with one poller each pusher's arrive in the order it pushed them.
func TestCQConcurrent(t *testing.T) {
	for _, pollers := range []int{1, 3} {
		const pushers, each = 4, 20000
		cq := newCQ(nil, shm.WaitConfig{})
		var wg sync.WaitGroup
		for p := range pushers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range uint64(each) {
					cq.push(&Completion{ID: uint64(p)<<32 | i, Status: StatusSuccess})
				}
			}()
		}
		seen := make([][]bool, pushers)
		for p := range seen {
			seen[p] = make([]bool, each)
		}
		var mu sync.Mutex
		total := 0
		errc := make(chan string, pollers)
		var pw sync.WaitGroup
		for range pollers {
			pw.Add(1)
			go func() {
				defer pw.Done()
				last := make([]int64, pushers)
				for i := range last {
					last[i] = -1
				}
				out := make([]Completion, 1+pollers*3)
				for {
					n := cq.Poll(out)
					mu.Lock()
					for _, c := range out[:n] {
						p, i := int(c.ID>>32), int64(c.ID&0xffffffff)
						if seen[p][i] {
							errc <- "a completion arrived twice"
							mu.Unlock()
							return
						}
						seen[p][i] = true
						total++
						if pollers == 1 && i <= last[p] {
							errc <- "a pusher's completions arrived out of order"
							mu.Unlock()
							return
						}
						last[p] = i
					}
					done := total == pushers*each
					mu.Unlock()
					if done {
						return
					}
				}
			}()
		}
		wg.Wait()
		finished := make(chan struct{})
		go func() { pw.Wait(); close(finished) }()
		select {
		case msg := <-errc:
			t.Fatalf("%d poller(s): %s", pollers, msg)
		case <-finished:
		}
		select {
		case msg := <-errc:
			t.Fatalf("%d poller(s): %s", pollers, msg)
		default:
		}
		if total != pushers*each {
			t.Fatalf("%d poller(s): %d of %d completions", pollers, total, pushers*each)
		}
	}
}
