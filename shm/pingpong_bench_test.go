package shm

import (
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// BenchmarkRingPingPongThreads is a 64-byte ping-pong over two rings
// between two locked threads of this process, both busy polling: the
// ring's part of a connection's round trip, for comparison with the same
// loop one layer up (nic BenchmarkInPlacePingPong, sockets
// BenchmarkPingPongThreads).
func BenchmarkRingPingPongThreads(b *testing.B) {
	busy := WaitConfig{Mode: WaitBusyPoll}
	p1, c1 := newRing(b, 1<<20, busy, busy)
	p2, c2 := newRing(b, 1<<20, busy, busy)
	const msgTag, stopTag = 1, 2
	msg, in, out := make([]byte, 64), make([]byte, 64), make([]byte, 64)
	// recv copies the next record of c into buf and releases it.
	recv := func(c *Consumer, buf []byte) (uint16, error) {
		rec, err := c.Next(time.Time{})
		if err != nil {
			return 0, err
		}
		copy(buf, rec.Data)
		c.Release()
		return rec.Tag, nil
	}
	testutil.PingPongThreads(b,
		func() error {
			if err := p1.Write(msgTag, msg, time.Time{}); err != nil {
				return err
			}
			_, err := recv(c2, in)
			return err
		},
		func() (bool, error) {
			tag, err := recv(c1, out)
			if err != nil || tag == stopTag {
				return true, err
			}
			return false, p2.Write(msgTag, out, time.Time{})
		},
		func() error { return p1.Write(stopTag, msg, time.Time{}) })
}
