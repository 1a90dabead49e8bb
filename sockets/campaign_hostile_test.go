package sockets

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// A hostile peer across processes: a child that speaks the session
// protocol but lies (the attacks of validate_test.go: wrong lengths,
// credits it does not have, descriptors outside its registrations,
// revoked keys, an out-of-order done, …). The victim, this process, aborts
// that connection only, never panics, writes nothing outside the buffers
// it reads into (guard bytes) nor into the liar's memory outside a live
// registration (the liar checks its guards), and its other connections
// carry on.

// The liar: dials args[1] and tells the lie of attack args[0]; then it
// must see a reset, and its memory must be intact.
func init() {
	testutil.RegisterChild("campaign-liar", func(args []string) error {
		for _, tc := range attacks {
			if tc.name != args[0] {
				continue
			}
			err := func() error {
				c, err := dialParent(tc.cfg, args[1])
				if err != nil {
					return err
				}
				defer c.Close()
				check, err := tc.lie(c.(*Conn))
				if err != nil {
					return fmt.Errorf("lie: %w", err)
				}
				if tc.whole {
					say("lied")
				}
				if err := expectOffenderReset(c); err != nil {
					return err
				}
				if check != nil {
					if err := check(); err != nil {
						return fmt.Errorf("liar's memory: %w", err)
					}
				}
				return nil
			}()
			if err != nil {
				say("error " + err.Error())
				return err
			}
			say("ok")
			return nil
		}
		return fmt.Errorf("no attack %q", args[0])
	})
}

func TestCampaignHostilePeer(t *testing.T) {
	base := takeBaseline(t)
	// Bystanders on the devices the victims use, both RDMA-Read modes.
	noRead := &Config{NoRDMARead: true}
	by := [][2]net.Conn{}
	for _, cfg := range []*Config{nil, noRead} {
		a, b := pipe(t, cfg, cfg)
		by = append(by, [2]net.Conn{a, b})
	}
	for _, tc := range attacks {
		t.Run(tc.name, func(t *testing.T) {
			if tc.split {
				splitAnyMemory(t)
			}
			addr := testAddr()
			lc := ListenConfig{Config: tc.cfg}
			ln, err := lc.Listen(context.Background(), "sandirect", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			child, n := startNoted(t, "campaign-liar", tc.name, addr)
			defer n.close()
			good := within(t, "accept", 20*time.Second, func() net.Conn {
				c, err := ln.Accept()
				if err != nil {
					t.Errorf("accept: %v", err)
				}
				return c
			})
			if good == nil {
				t.FailNow()
			}
			if tc.victim != nil {
				go tc.victim(good)
			}
			if tc.whole {
				n.wait(t, "lied")
			}
			expectVictimAbort(t, good, tc.reason)
			n.wait(t, "ok")
			if err := child.Wait(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			good.Close()
			waitTorn(t, good)
			// The other connections of this process carry on.
			for _, p := range by {
				exchange(t, p[0], p[1])
			}
		})
	}
	for _, p := range by {
		p[0].Close()
		p[1].Close()
		waitTorn(t, p[0])
		waitTorn(t, p[1])
	}
	base.check(t)
}

// exchange sends a rendezvous-sized message each way between a and b.
func exchange(t *testing.T, a, b net.Conn) {
	t.Helper()
	msg := randBytes(100 << 10)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Write(msg)
		if err == nil {
			got := make([]byte, len(msg))
			if _, err = io.ReadFull(a, got); err == nil && !bytes.Equal(got, msg) {
				err = fmt.Errorf("bytes differ")
			}
		}
		errc <- err
	}()
	got := make([]byte, len(msg))
	b.SetDeadline(time.Now().Add(20 * time.Second))
	defer b.SetDeadline(time.Time{})
	if _, err := io.ReadFull(b, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("bystander read: %v", err)
	}
	if _, err := b.Write(msg); err != nil {
		t.Fatalf("bystander write: %v", err)
	}
	if err := within(t, "bystander", 20*time.Second, func() error { return <-errc }); err != nil {
		t.Fatalf("bystander: %v", err)
	}
}
