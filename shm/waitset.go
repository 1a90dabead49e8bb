package shm

import "slices"

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
	return load64(at(c.data, c.headPos&c.mask)) != 0 || load32(c.pClosed) != 0 || c.err.Load() != nil
}
