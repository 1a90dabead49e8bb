package shm

import (
	"runtime"
	"testing"
	"time"
)

// BenchmarkRingPingPongThreads is a 64-byte ping-pong over two rings
// between two locked threads of this process, both busy polling: the
// ring's part of a connection's round trip, for comparison with the same
// loop one layer up (nic BenchmarkInPlacePingPong, sockets
// BenchmarkPingPongThreads). Reported per one-way trip.
func BenchmarkRingPingPongThreads(b *testing.B) {
	busy := WaitConfig{Mode: WaitBusyPoll}
	p1, c1 := newRing(b, 1<<20, busy, busy)
	p2, c2 := newRing(b, 1<<20, busy, busy)
	const stop = 2
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		out := make([]byte, 64)
		for {
			rec, err := c1.Next(time.Time{})
			if err != nil {
				errc <- err
				return
			}
			copy(out, rec.Data)
			c1.Release()
			if rec.Tag == stop {
				errc <- nil
				return
			}
			if err := p2.Write(1, out, time.Time{}); err != nil {
				errc <- err
				return
			}
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	msg, in := make([]byte, 64), make([]byte, 64)
	for b.Loop() {
		if err := p1.Write(1, msg, time.Time{}); err != nil {
			b.Fatal(err)
		}
		rec, err := c2.Next(time.Time{})
		if err != nil {
			b.Fatal(err)
		}
		copy(in, rec.Data)
		c2.Release()
	}
	if err := p1.Write(stop, msg, time.Time{}); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/one-way")
}
