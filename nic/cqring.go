package nic

import "sync/atomic"

// cqRing is the lock-free front of a completion queue: a bounded
// multi-producer, multi-consumer queue of completions in which each slot
// carries a sequence number (the scheme of Dmitry Vyukov's bounded MPMC
// queue). A push and a pop each cost one compare-and-swap, where the
// mutex-guarded slice behind it costs a lock, an unlock and a counter's
// locked add on each side (docs/performance.md, "A completion queue
// without a lock"). What does not fit goes to that slice (CompletionQueue.push).
//
// Slot i holds seq == t when it is free for the push of ticket t, and
// seq == t+1 once that push's completion is in it; the pop of ticket t
// then frees it for ticket t+cqSlots. The completion itself is written
// and read around those atomic stores and loads, which order it.
type cqRing struct {
	_     [64]byte // head and tail on lines of their own: pushers and pollers run on different threads
	head  atomic.Uint64
	_     [56]byte
	tail  atomic.Uint64
	_     [56]byte
	slots [cqSlots]cqSlot
}

// cqSlots is the ring's size, a power of two: enough for the completions
// of a latency loop or a window of signaled sends; a burst beyond it
// takes the locked path, as every completion used to.
const cqSlots = 32

type cqSlot struct {
	seq atomic.Uint64
	c   Completion
}

func (r *cqRing) init() {
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
}

// push appends *c; false when the ring is full.
func (r *cqRing) push(c *Completion) bool {
	for {
		t := r.tail.Load()
		s := &r.slots[t&(cqSlots-1)]
		switch d := int64(s.seq.Load() - t); {
		case d == 0:
			if r.tail.CompareAndSwap(t, t+1) {
				s.c = *c
				s.seq.Store(t + 1)
				return true
			}
		case d < 0:
			return false // the pop of ticket t-cqSlots has not freed it
		}
		// Another pusher took ticket t: try the next.
	}
}

// pop moves the oldest completion into *out; false when the ring is
// empty (or its oldest push has its ticket but not yet its completion
// written: it counts as not there yet).
func (r *cqRing) pop(out *Completion) bool {
	for {
		h := r.head.Load()
		s := &r.slots[h&(cqSlots-1)]
		switch d := int64(s.seq.Load() - (h + 1)); {
		case d == 0:
			if r.head.CompareAndSwap(h, h+1) {
				*out = s.c
				s.c = Completion{} // drop references to QPs and errors
				s.seq.Store(h + cqSlots)
				return true
			}
		case d < 0:
			return false
		}
		// Another poller took ticket h: try the next.
	}
}

// ready tells whether a pop would find a completion, without taking it.
func (r *cqRing) ready() bool {
	h := r.head.Load()
	return r.slots[h&(cqSlots-1)].seq.Load() == h+1
}

// popInto pops into out until it is full or the ring empty; it returns how
// many it popped.
func (r *cqRing) popInto(out []Completion) int {
	n := 0
	for n < len(out) && r.pop(&out[n]) {
		n++
	}
	return n
}
