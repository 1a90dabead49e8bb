// Package quiesce waits out the critical sections in progress under a set
// of locks: a barrier for code that has just made new work impossible
// (closed a connection, retired a segment) and must know that the work
// begun before has ended.
package quiesce

import "sync"

// Wait returns once every critical section that holds one of locks when
// Wait is called has ended. It takes the locks in the order given, which
// must be their lock order, then releases them in reverse; it leaves them
// as it found them. Later critical sections may begin at once. Safe for
// concurrent use.
func Wait(locks ...sync.Locker) {
	for _, l := range locks {
		l.Lock()
	}
	for i := len(locks) - 1; i >= 0; i-- {
		locks[i].Unlock()
	}
}
