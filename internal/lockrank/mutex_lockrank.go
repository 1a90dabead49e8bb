//go:build lockrank

package lockrank

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
)

// Enabled reports whether the build checks lock ranks (-tags lockrank).
const Enabled = true

// ranked is what a checked lock keeps besides the lock itself: its rank,
// and the goroutine that holds it for writing (an Unlock may come from
// another).
type ranked struct {
	rank   Rank
	holder int64
}

// Init gives the lock its rank; it is called once, before it is first
// locked.
func (r *ranked) Init(rank Rank) { r.rank = rank }

// lock checks the order before l may block, so that a lock taken out of
// order is reported rather than left to deadlock; m names the lock.
func (r *ranked) lock(l sync.Locker, m any) {
	if r.rank == Unranked {
		l.Lock()
		return
	}
	g := goid()
	check(g, r.rank)
	l.Lock()
	r.holder = g
	hold(g, r.rank, m)
}

// unlock unlocks l, which may have been locked by another goroutine.
func (r *ranked) unlock(l sync.Locker, m any) {
	if r.rank == Unranked {
		l.Unlock()
		return
	}
	g := r.holder
	r.holder = 0
	l.Unlock()
	release(g, m)
}

// Mutex is a sync.Mutex with a rank, checked at every Lock.
type Mutex struct {
	mu sync.Mutex
	ranked
}

// Lock locks m.
func (m *Mutex) Lock() { m.lock(&m.mu, m) }

// Unlock unlocks m, which may have been locked by another goroutine.
func (m *Mutex) Unlock() { m.unlock(&m.mu, m) }

// RWMutex is a sync.RWMutex with a rank, checked at every Lock and RLock.
type RWMutex struct {
	mu sync.RWMutex
	ranked
}

// Lock locks m for writing.
func (m *RWMutex) Lock() { m.lock(&m.mu, m) }

// Unlock unlocks m for writing.
func (m *RWMutex) Unlock() { m.unlock(&m.mu, m) }

// RLock locks m for reading; a reader that already holds m must not take
// it again either, since a writer waiting in between deadlocks both.
func (m *RWMutex) RLock() {
	if m.rank == Unranked {
		m.mu.RLock()
		return
	}
	g := goid()
	check(g, m.rank)
	m.mu.RLock()
	hold(g, m.rank, m)
}

// RUnlock undoes one RLock, by the goroutine that took it.
func (m *RWMutex) RUnlock() {
	m.mu.RUnlock()
	if m.rank != Unranked {
		release(goid(), m)
	}
}

type held struct {
	rank Rank
	lock any
}

var state struct {
	mu         sync.Mutex
	held       map[int64][]held // by goroutine
	violations []Violation
}

// check records and panics if goroutine g holds a lock of rank r or higher.
func check(g int64, r Rank) {
	state.mu.Lock()
	var v *Violation
	for _, h := range state.held[g] {
		if h.rank >= r {
			v = &Violation{Held: h.rank, Taken: r, Stack: stack()}
			state.violations = append(state.violations, *v)
			break
		}
	}
	state.mu.Unlock()
	if v != nil {
		panic(v.String())
	}
}

func hold(g int64, r Rank, l any) {
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.held == nil {
		state.held = make(map[int64][]held)
	}
	state.held[g] = append(state.held[g], held{r, l})
}

// release forgets one hold of l by g; locks are released in any order.
func release(g int64, l any) {
	state.mu.Lock()
	defer state.mu.Unlock()
	hs := state.held[g]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].lock == l {
			hs = append(hs[:i], hs[i+1:]...)
			break
		}
	}
	if len(hs) == 0 {
		delete(state.held, g)
	} else {
		state.held[g] = hs
	}
}

// Violations returns the lock-order violations seen so far.
func Violations() []Violation {
	state.mu.Lock()
	defer state.mu.Unlock()
	return append([]Violation(nil), state.violations...)
}

// goid is the calling goroutine's id, from the header of its stack trace
// ("goroutine 7 [running]:"): the runtime offers no other way.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	id, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		panic("lockrank: cannot parse the goroutine id: " + err.Error())
	}
	return id
}

func stack() string {
	buf := make([]byte, 16<<10)
	return string(buf[:runtime.Stack(buf, false)])
}
