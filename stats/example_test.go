package stats_test

import (
	"fmt"
	"os"
	"sync/atomic"

	"github.com/sandirect/sandirect/stats"
)

// A layer publishes its counters; a tool reads them from another process.
// Here both sides are this process.
func Example() {
	var requests atomic.Uint64
	requests.Add(3)
	unregister := stats.Register("server/1", func(emit func(name string, v uint64)) {
		emit("requests", requests.Load()) // called every interval, off the hot path
	})
	defer unregister()

	r, err := stats.Open(os.Getpid()) // what sdstat does with the pid of a live endpoint
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	s, err := r.Snapshot()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range s.Counters {
		fmt.Println(c.Group, c.Name, c.Value)
	}
	// Output: server/1 requests 3
}
