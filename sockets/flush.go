package sockets

import (
	"context"

	"github.com/sandirect/sandirect/internal/lockrank"
)

// lingering counts closed connections still delivering what they wrote.
var lingering struct {
	mu   lockrank.Mutex // guards n, idle; a leaf, taken under Conn.mu by Close
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func init() { lingering.mu.Init(lockrank.Lingering) }

func lingerStart() {
	lingering.mu.Lock()
	if lingering.n == 0 {
		lingering.idle = make(chan struct{})
	}
	lingering.n++
	lingering.mu.Unlock()
}

func lingerEnd() {
	lingering.mu.Lock()
	lingering.n--
	if lingering.n == 0 {
		close(lingering.idle)
		lingering.idle = nil
	}
	lingering.mu.Unlock()
}

// Flush waits until every connection this process closed has delivered
// what it wrote (or given up, after Config.Linger), or ctx ends. Close
// returns before the peer has taken the last bytes, and the bytes live in
// this process: a program should Flush before it exits.
func Flush(ctx context.Context) error {
	lingering.mu.Lock()
	idle := lingering.idle
	lingering.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
