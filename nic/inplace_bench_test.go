package nic

import (
	"testing"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/shm"
)

// BenchmarkInPlacePingPong is a 64-byte ping-pong of in-place sends
// (ReserveSend, CommitSend, RecvInPlace, ReleaseRecv: what a sockets.Conn
// drives) between two locked threads of this process, busy polling; the
// receivers declared spinning (commits without a fence) or not. The layer
// between the ring (shm BenchmarkRingPingPongThreads) and the connection
// (sockets BenchmarkPingPongThreads).
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
			// recv copies the next send into out and releases it.
			recv := func(q *QueuePair, out []byte) error {
				for {
					d, end, ok, err := q.RecvInPlace()
					if err != nil || ok {
						if ok {
							copy(out, d)
							q.ReleaseRecv(end)
						}
						return err
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
			const stop = 2 // first byte of the last message
			msg, in, out := make([]byte, 64), make([]byte, 64), make([]byte, 64)
			testutil.PingPongThreads(b,
				func() error {
					if err := send(a.qp, msg); err != nil {
						return err
					}
					return recv(a.qp, in)
				},
				func() (bool, error) {
					if err := recv(p.qp, out); err != nil || out[0] == stop {
						return true, err
					}
					return false, send(p.qp, out)
				},
				func() error {
					msg[0] = stop
					return send(a.qp, msg)
				})
		})
	}
}
