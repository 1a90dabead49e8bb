package bpfmon_test

import (
	"fmt"
	"sync/atomic"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/internal/sys"
)

// The protocol of a registration cache on top of the monitor: watch what is
// registered; on every lookup compare the epoch with the one the cache is
// current at, and Sync when they differ.
func Example() {
	m, err := bpfmon.Open(nil) // this process, default methods
	if err != nil {
		fmt.Println("no eBPF monitor:", err) // errors.Is(err, bpfmon.ErrNotSupported)
		return
	}
	defer m.Close()
	fmt.Println("attached by", m.Method(), "after", m.Reasons())

	buf := make([]byte, 1<<20) // a registered buffer (kept alive by the cache)
	start, length := sys.Addr(buf), uintptr(len(buf))
	if err := m.Watch(start, length); err != nil {
		m.WatchAll(true) // too many granules: report everything
	}

	var current uint64 // the epoch the cache reflects
	epoch := m.EpochWord()
	lookup := func() {
		if atomic.LoadUint64(epoch) != current { // one load on the hit path
			e, err := m.Sync(
				func(ev bpfmon.Event) { /* invalidate entries overlapping [ev.Start, ev.Start+ev.Length) */ },
				func() { /* events were lost: invalidate everything */ },
			)
			if err != nil {
				return // closed or broken: stop trusting the cache
			}
			current = e
		}
		// ... the cache's answer is now current for every munmap that
		// has returned.
	}
	lookup()
}
