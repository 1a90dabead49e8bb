package nic

import (
	"runtime"
	"testing"

	"github.com/sandirect/sandirect/shm"
)

// BenchmarkInPlacePingPong is a 64-byte ping-pong of in-place sends
// (ReserveSend, CommitSend, RecvInPlace, ReleaseRecv: what a sockets.Conn
// drives) between two locked threads of this process, busy polling; the
// receivers declared spinning (commits without a fence) or not. The layer
// between the ring (shm BenchmarkRingPingPongThreads) and the connection
// (sockets BenchmarkPingPongThreads). Reported per one-way trip.
func BenchmarkInPlacePingPong(b *testing.B) {
	for _, spinning := range []bool{false, true} {
		name := "fenced"
		if spinning {
			name = "spinning"
		}
		b.Run(name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Wait = shm.WaitConfig{Mode: shm.WaitBusyPoll}
			a, p := pairWith(b, &cfg, &cfg, func(o *QPOptions) { o.InPlace = true })
			if spinning {
				for _, q := range []*QueuePair{a.qp, p.qp} {
					if err := q.SetSpinning(); err != nil {
						b.Skip(err)
					}
				}
			}
			recv := func(q *QueuePair, out []byte) (byte, error) {
				for {
					d, end, ok, err := q.RecvInPlace()
					if err != nil || ok {
						if ok {
							copy(out, d)
							q.ReleaseRecv(end)
						}
						return out[0], err
					}
				}
			}
			send := func(q *QueuePair, m []byte) error {
				buf, err := q.ReserveSend(len(m))
				if err != nil {
					return err
				}
				copy(buf, m)
				return q.CommitSend(len(m))
			}
			const stop = 2
			errc := make(chan error, 1)
			go func() {
				runtime.LockOSThread()
				out := make([]byte, 64)
				for {
					v, err := recv(p.qp, out)
					if err == nil && v != stop {
						err = send(p.qp, out)
					}
					if err != nil || v == stop {
						errc <- err
						return
					}
				}
			}()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			msg, in := make([]byte, 64), make([]byte, 64)
			for b.Loop() {
				if err := send(a.qp, msg); err != nil {
					b.Fatal(err)
				}
				if _, err := recv(a.qp, in); err != nil {
					b.Fatal(err)
				}
			}
			msg[0] = stop
			if err := send(a.qp, msg); err != nil {
				b.Fatal(err)
			}
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/one-way")
		})
	}
}
