//go:build !lockrank

package lockrank

import "sync"

// Enabled reports whether the build checks lock ranks (-tags lockrank).
const Enabled = false

// Mutex is a sync.Mutex with a rank. Without the lockrank tag the rank is
// not kept and every method forwards, so it costs what a sync.Mutex does.
// The zero Mutex is an unlocked, unranked mutex; it must not be copied.
type Mutex struct {
	mu sync.Mutex
}

// Init gives m its rank; it is called once, before m is first locked.
func (m *Mutex) Init(r Rank) {}

// Lock locks m.
func (m *Mutex) Lock() { m.mu.Lock() }

// Unlock unlocks m.
func (m *Mutex) Unlock() { m.mu.Unlock() }

// RWMutex is a sync.RWMutex with a rank; readers and writers alike take
// it in rank order.
type RWMutex struct {
	mu sync.RWMutex
}

// Init gives m its rank; it is called once, before m is first locked.
func (m *RWMutex) Init(r Rank) {}

// Lock locks m for writing.
func (m *RWMutex) Lock() { m.mu.Lock() }

// Unlock unlocks m for writing.
func (m *RWMutex) Unlock() { m.mu.Unlock() }

// RLock locks m for reading.
func (m *RWMutex) RLock() { m.mu.RLock() }

// RUnlock undoes one RLock.
func (m *RWMutex) RUnlock() { m.mu.RUnlock() }

// Violations returns the lock-order violations seen; without the lockrank
// tag there is no checker, and none.
func Violations() []Violation { return nil }
