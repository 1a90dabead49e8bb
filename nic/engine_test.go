package nic

import (
	"testing"
	"time"

	"github.com/sandirect/sandirect/shm"
)

// queuedWrites is postQueuedWrites' set-up: post posts one more write.
type queuedWrites struct {
	a        *end
	src, dst []byte
	post     func(id uint64)
}

// postQueuedWrites holds the engine off for an hour after a poller's
// turn, connects two devices waiting in mode, and posts ops RDMA Writes
// of size bytes into the second's device memory, all queued (no inline
// execution) in 64 KiB chunks.
func postQueuedWrites(t *testing.T, mode shm.WaitMode, ops, size int) (a *end, src, dst []byte) {
	w := newQueuedWrites(t, mode, size)
	for i := range ops {
		w.post(uint64(i))
	}
	return w.a, w.src, w.dst
}

func newQueuedWrites(t *testing.T, mode shm.WaitMode, size int) *queuedWrites {
	t.Helper()
	old := engineYield
	engineYield = time.Hour
	t.Cleanup(func() { engineYield = old })
	cfg := DefaultConfig()
	cfg.Wait = shm.WaitConfig{Mode: mode}
	cfg.InlineExec = -1 // none: the engine moves everything
	cfg.Chunk = 64 << 10
	a, b := pair(t, &cfg, &cfg)
	dst := alloc(t, b.d, size)
	dmr := register(t, b.d, dst, AccessLocalWrite|AccessRemoteWrite)
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i * 13)
	}
	smr := register(t, a.d, src, 0)
	return &queuedWrites{a: a, src: src, dst: dst, post: func(id uint64) {
		t.Helper()
		if err := a.qp.PostSend(SendWR{ID: id, Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(dmr.Addr), RKey: dmr.RKey}); err != nil {
			t.Fatal(err)
		}
	}}
}

// TestPollerKeepsItsWork: once a poller of the send CQ runs a turn of a
// queue pair's queued work, the engine leaves that queue pair to it while
// it keeps polling (here for as long as the test runs), so chunks do not
// alternate between the poller's CPU and the engine's, each pulling the
// buffers over from the other's caches. The work still completes, every
// chunk counted once.
func TestPollerKeepsItsWork(t *testing.T) {
	const ops, size, chunk = 16, 1 << 20, 64 << 10
	a, src, dst := postQueuedWrites(t, shm.WaitBusyPoll, ops, size)
	var cs [ops]Completion
	got := a.scq.Poll(cs[:]) // runs a turn: from here on the queue pair is the poller's
	engineBefore := a.qp.Stats().EngineChunks
	deadline := time.Now().Add(10 * time.Second)
	for got < ops {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d writes completed after 10 s", got, ops)
		}
		got += a.scq.Poll(cs[got:])
	}
	for i, c := range cs {
		if c.Status != StatusSuccess || c.ID != uint64(i) {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	st := a.qp.Stats()
	if st.EngineChunks != engineBefore {
		t.Errorf("the engine ran %d chunks while a poller kept polling", st.EngineChunks-engineBefore)
	}
	if want := uint64(ops * size / chunk); st.PolledChunks+st.EngineChunks != want {
		t.Errorf("%d chunks by pollers and %d by the engine, want %d in all", st.PolledChunks, st.EngineChunks, want)
	}
	if st.PolledChunks == 0 {
		t.Error("the poller ran no chunk")
	}
	for i := range dst {
		if dst[i] != src[i] {
			t.Fatalf("byte %d: %d, want %d", i, dst[i], src[i])
		}
	}
}

// TestSleepingWaiterLeavesWork: a waiter that sleeps hands its queue
// pairs' queued work back to the engine at once, instead of the engine
// leaving it to a poller that is gone for engineYield (here an hour).
func TestSleepingWaiterLeavesWork(t *testing.T) {
	const ops = 4
	a, _, _ := postQueuedWrites(t, shm.WaitBlock, ops, 1<<20)
	var cs [ops]Completion
	got := 0
	for got < ops {
		// Each Wait polls (a turn of its own) before it sleeps; without
		// the hand-back the engine would then wait an hour.
		n, err := a.scq.Wait(cs[got:], time.Now().Add(10*time.Second))
		if err != nil {
			t.Fatalf("%d of %d writes completed: %v", got, ops, err)
		}
		got += n
	}
	if st := a.qp.Stats(); st.EngineChunks == 0 {
		t.Errorf("the engine ran no chunk for a sleeping waiter (%d by pollers)", st.PolledChunks)
	}
}

// TestEngineHoldsOneCopy: a poller that finishes its queue pair's work,
// again and again, while the engine holds the queue pair aside for it,
// does not pile up copies of the queue pair on the engine's lists (one
// per batch of work, kept for as long as the poller polls).
func TestEngineHoldsOneCopy(t *testing.T) {
	w := newQueuedWrites(t, shm.WaitBusyPoll, 64<<10)
	a := w.a
	var cs [1]Completion
	for i := range 100 {
		w.post(uint64(i)) // queued: the engine is told of it
		deadline := time.Now().Add(10 * time.Second)
		for a.scq.Poll(cs[:]) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("write %d: no completion after 10 s", i)
			}
		}
		if cs[0].Status != StatusSuccess || cs[0].ID != uint64(i) {
			t.Fatalf("write %d: completion %+v", i, cs[0])
		}
	}
	if n := a.d.eng.holds(a.qp); n > 1 {
		t.Errorf("the engine holds %d copies of the queue pair after 100 batches of work", n)
	}
}

// holds counts the engine's copies of qp on its lists.
func (e *engine) holds(qp *QueuePair) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, q := range append(e.ready[:len(e.ready):len(e.ready)], e.aside...) {
		if q == qp {
			n++
		}
	}
	return n
}
