package sockets

import (
	"io"
	"testing"
	"time"

	"github.com/sandirect/sandirect/shm"
)

// TestReplyWait: in block mode, a side that waits right after it sent
// looks for the answer for Config.ReplyWait before it sleeps. With a long
// look the pinger never sleeps; with none, it never looks and sleeps
// whenever the answer is not there at once.
func TestReplyWait(t *testing.T) {
	const rounds = 100
	for _, tc := range []struct {
		name  string
		wait  time.Duration
		check func(t *testing.T, c Counters)
	}{
		{"caught", time.Second, func(t *testing.T, c Counters) {
			// An answer may also be there at the first look.
			if c.Sleeps != 0 {
				t.Errorf("%d sleeps in %d round trips (%d replies caught while looking); want none", c.Sleeps, rounds, c.RepliesCaught)
			}
		}},
		{"sleep-at-once", -1, func(t *testing.T, c Counters) {
			// How many answers beat the sleep depends on the machine (in
			// one process 19-100 of 100 did not): some must not.
			if c.RepliesCaught != 0 || c.Sleeps == 0 {
				t.Errorf("%d sleeps, %d replies caught in %d round trips; want some and none", c.Sleeps, c.RepliesCaught, rounds)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Wait: shm.WaitConfig{Mode: shm.WaitBlock}, ReplyWait: tc.wait}
			echoCfg := Config{Wait: shm.WaitConfig{Mode: shm.WaitBlock}, ReplyWait: -1}
			c, s := pipe(t, &cfg, &echoCfg)
			done := make(chan error, 1)
			go func() {
				_, err := io.Copy(s, s)
				done <- err
			}()
			msg, in := []byte("ping pong"), make([]byte, 9)
			// The first round trip settles the handshake's messages.
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, in); err != nil {
				t.Fatal(err)
			}
			before := c.(*Conn).Stats()
			for range rounds {
				if _, err := c.Write(msg); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, in); err != nil || string(in) != string(msg) {
					t.Fatalf("echo %q, %v", in, err)
				}
			}
			after := c.(*Conn).Stats()
			tc.check(t, Counters{Sleeps: after.Sleeps - before.Sleeps, RepliesCaught: after.RepliesCaught - before.RepliesCaught})
			c.Close()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}
