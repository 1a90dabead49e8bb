package shm

import (
	"slices"

	"github.com/sandirect/sandirect/internal/mem"
)

// WaitSet is a set of rings one goroutine waits on together, parking on
// one Waiter: a completion queue fed by many queue pairs waits on one. Arm
// announces the waiter on every ring's doorbell, so that whichever
// producer commits first wakes it; there is no limit on the number of
// rings.
//
// Add, Remove and Arm must not run concurrently with each other (the
// caller serializes them).
type WaitSet struct {
	cs []*Consumer
}

// Add makes Arm announce on c's doorbell. c's own Next must not be used
// while c is in a set.
func (w *WaitSet) Add(c *Consumer) { w.cs = append(w.cs, c) }

// Remove takes c out of the set. Once it returns, the set no longer
// touches c's memory: the caller may unmap it.
func (w *WaitSet) Remove(c *Consumer) {
	if i := slices.Index(w.cs, c); i >= 0 {
		w.cs = slices.Delete(w.cs, i, i+1)
		store32(c.cBell, 0)
	}
}

// Len returns the number of rings in the set.
func (w *WaitSet) Len() int { return len(w.cs) }

// Arm stores bell in every ring's consumer doorbell: a Waiter's Bell() to
// announce that it sleeps, zero to withdraw.
func (w *WaitSet) Arm(bell uint32) {
	for _, c := range w.cs {
		c.armBell(bell)
	}
}

// Pending tells whether c has something for its reader: a record, a close
// or a failure. It loads shared words and does not consume anything.
func (c *Consumer) Pending() bool {
	if h := load64(at(c.data, c.headPos&c.mask)); h != 0 {
		c.prefetchRecord(h)
		return true
	}
	return load32(c.pClosed) != 0 || c.err.Load() != nil
}

// prefetchRecord asks for the lines after the first of the record whose
// header h was just seen at the head, so that they come across the cores
// while the reader is still on its way to them (the lock, the dispatch)
// rather than one by one when it gets there: a 64-byte message is 80
// bytes of ring, two lines, and a 4 KiB one 66 (docs/performance.md, "The
// second line of a message"). A record of more than 4 KiB after its first
// line is left to the copy, whose reads stream. h is the peer's word: any
// length is clamped to the ring.
func (c *Consumer) prefetchRecord(h uint64) {
	off := c.headPos & c.mask
	start := (off &^ 63) + 64
	end := min(off+recHeaderSize+(h&hdrLenMask), uint64(len(c.dataMem)))
	if start < end && end-start <= prefetchMax {
		mem.Prefetch(c.dataMem[start:end])
	}
}

// prefetchMax bounds the bytes prefetchRecord asks for.
const prefetchMax = 4096
