package shm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// WaitSet lets one goroutine sleep until any of several rings has a record
// or until code in this process rings the set, with one futex_waitv call
// (Linux 5.16). A completion queue fed by many queue pairs waits on one.
//
// Add, Remove and Wait must not run concurrently with each other (the
// caller serializes them); Ring may be called from any goroutine at any
// time.
type WaitSet struct {
	cs   []*Consumer
	bell atomic.Uint32 // 1 = the owner sleeps; in-process wakers swap it to 0
	// one is the doorbell of the set's only ring while a Wait sleeps on
	// that word alone (plain FUTEX_WAIT: no futex_waitv over two words);
	// Ring then wakes the owner there. nil when the set has more rings.
	one     atomic.Pointer[uint32]
	ringing atomic.Int32 // Ring calls that may still use one
	vec     []sys.FutexWaiter
}

// Add makes Wait return when c has a record, is closed or has failed. c's
// own Next must not be used while c is in a set.
func (w *WaitSet) Add(c *Consumer) { w.cs = append(w.cs, c) }

// Remove takes c out of the set. Once it returns, no Ring touches c's
// memory: the caller may unmap it.
func (w *WaitSet) Remove(c *Consumer) {
	if i := slices.Index(w.cs, c); i >= 0 {
		w.cs = slices.Delete(w.cs, i, i+1)
	}
	if w.one.Load() == c.cBell {
		w.one.Store(nil)
		// A Ring that loaded the word before the store above counts
		// itself first: wait it out (a few instructions).
		for w.ringing.Load() != 0 {
			runtime.Gosched()
		}
	}
}

// Ring wakes the set's owner if it sleeps in Wait.
func (w *WaitSet) Ring() {
	if w.bell.Load() == 0 {
		return
	}
	w.ringing.Add(1) // before one is loaded: see Remove
	if w.bell.Swap(0) != 0 {
		// one was stored before the bell was announced: it is this Wait's
		// word, or a later Wait's (then the wake-up is merely early).
		if p := w.one.Load(); p != nil {
			if swap32(p, 0) != 0 {
				sys.FutexWake(p, 1)
			}
		} else {
			// The bell is ours alone: a private futex, keyed by address.
			sys.FutexWakePrivate(w.bellWord(), 1)
		}
	}
	w.ringing.Add(-1)
}

func (w *WaitSet) bellWord() *uint32 { return (*uint32)(rawPointer(&w.bell)) }

// Pending tells whether c has something for its reader: a record, a close
// or a failure. It loads shared words and does not consume anything.
func (c *Consumer) Pending() bool {
	return load64(at(c.data, c.headPos&c.mask)) != 0 || load32(c.pClosed) != 0 || c.err.Load() != nil
}

// Wait sleeps until a producer of a ring in the set commits or closes,
// Ring is called, or deadline passes (os.ErrDeadlineExceeded; zero: no
// deadline). ready is checked after announcing on every word and before
// sleeping: it must report everything the caller waits for — in-process
// work that Ring announces, and the Pending state of the rings it cares
// about now (a caller may ignore a ring whose records it cannot take yet).
// Wait may return early; callers re-check their state and call it again.
func (w *WaitSet) Wait(ready func() bool, deadline time.Time) error {
	timeout := time.Duration(-1)
	if !deadline.IsZero() {
		if timeout = time.Until(deadline); timeout <= 0 {
			return os.ErrDeadlineExceeded
		}
	}
	n := len(w.cs) + 1
	if n > sys.FutexWaitvMax {
		// Too many words for one call: announce on all the same, and
		// sleep on the bell in short slices, re-checking the rings.
		n = 1
		if timeout < 0 || timeout > time.Millisecond {
			timeout = time.Millisecond
		}
	}
	// With one ring, sleep on its doorbell alone: Ring wakes us there.
	var one *uint32
	if len(w.cs) == 1 {
		one = w.cs[0].cBell
	}
	if w.one.Load() != one {
		w.one.Store(one)
	}
	// Announce on every word, then re-check: each producer (and Ring)
	// stores its update before it loads the word, so one side sees the
	// other.
	w.bell.Store(1)
	for _, c := range w.cs {
		store32(c.cBell, 1)
	}
	defer w.withdraw()
	if ready() {
		return nil
	}
	if one != nil {
		return sleep(one, deadline)
	}
	if cap(w.vec) < n {
		w.vec = make([]sys.FutexWaiter, n)
	}
	vec := w.vec[:n]
	vec[0].SetPrivateWord(w.bellWord(), 1)
	for i := 1; i < n; i++ {
		vec[i].SetWord(w.cs[i-1].cBell, 1)
	}
	_, err := sys.FutexWaitv(vec, timeout)
	if err != nil && !errors.Is(err, sys.EAGAIN) && !errors.Is(err, sys.EINTR) && !errors.Is(err, sys.ETIMEDOUT) {
		return fmt.Errorf("shm: futex_waitv: %w", err)
	}
	return nil
}

func (w *WaitSet) withdraw() {
	w.bell.Store(0)
	for _, c := range w.cs {
		store32(c.cBell, 0)
	}
}
