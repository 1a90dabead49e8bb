package testutil

import (
	"runtime"
	"testing"
)

// PingPongThreads measures round trips between two locked threads of this
// process, the loop of a benchmark of a layer's round trip across cores:
// ping sends a message and waits for its answer, in b's loop; echo, on
// the second thread, takes one message and answers it, and tells whether
// it was the last; stop sends that last one once the loop is over. It
// reports ns/one-way, half the round trip.
func PingPongThreads(b *testing.B, ping func() error, echo func() (last bool, err error), stop func() error) {
	b.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for {
			last, err := echo()
			if err != nil || last {
				errc <- err
				return
			}
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		if err := ping(); err != nil {
			b.Fatal(err)
		}
	}
	if err := stop(); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/one-way")
}
