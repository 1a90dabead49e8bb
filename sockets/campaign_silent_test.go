package sockets

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/nic"
)

// A peer that connects and then says nothing before the nic handshake (a
// bare Unix connection) holds up only its own connection: the listener
// serves other clients meanwhile, at once, not after HandshakeTimeout. A
// queue pair whose handshake carries no session hello is refused at once,
// and stays connected to nothing.

func init() {
	testutil.RegisterChild("campaign-silent", func(args []string) error {
		kind, addr := args[0], args[1]
		switch kind {
		case "unix":
			if _, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: addr, Net: "unixpacket"}); err != nil {
				return err
			}
		case "qp":
			d, err := nic.Open(nil)
			if err != nil {
				return err
			}
			cq := d.NewCQ()
			qp, err := d.Dial(addr, nic.QPOptions{SendCQ: cq, RecvCQ: cq})
			if err == nil {
				qp.Close()
				return errors.New("a queue pair without a session hello was accepted")
			}
			if !errors.Is(err, nic.ErrRefused) || !strings.Contains(err.Error(), "without a session hello") {
				return fmt.Errorf("refused with %v, want a reason about the session hello", err)
			}
		default:
			return fmt.Errorf("kind %q", kind)
		}
		say("connected")
		parkForever()
		return nil
	})
}

func TestCampaignSilentPeers(t *testing.T) {
	base := takeBaseline(t)
	addr := testAddr()
	cfg := Config{HandshakeTimeout: 20 * time.Second}
	lc := ListenConfig{Config: &cfg}
	ln, err := lc.Listen(context.Background(), "sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	var children []*testutil.Child
	for _, kind := range []string{"unix", "qp", "unix"} {
		child, n := startNoted(t, "campaign-silent", kind, addr)
		n.wait(t, "connected")
		n.close()
		children = append(children, child)
	}
	// A new client is served while all three are silent.
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := Dialer{Config: &cfg}
	c, err := d.DialContext(ctx, "sandirect", addr)
	if err != nil {
		t.Fatalf("dial while peers are silent: %v after %v", err, time.Since(start))
	}
	t.Logf("dial while three peers are silent: %v", time.Since(start))
	s := within(t, "accept", 10*time.Second, func() net.Conn {
		s, err := ln.Accept()
		if err != nil {
			t.Errorf("accept: %v", err)
		}
		return s
	})
	if s == nil {
		t.FailNow()
	}
	exchange(t, c, s)
	c.Close()
	s.Close()
	waitTorn(t, c)
	waitTorn(t, s)
	// Closing the listener ends the silent peers' handshakes at once.
	start = time.Now()
	within(t, "listener close", 10*time.Second, func() error { return ln.Close() })
	t.Logf("listener closed in %v with three silent peers", time.Since(start))
	for _, child := range children {
		child.Kill()
		<-child.Done()
	}
	base.check(t)
}

// TestCampaignAcceptThenClose: a connection accepted just before the
// listener closes is the application's: closing the listener (which ends
// the handshakes in progress) leaves it working.
func TestCampaignAcceptThenClose(t *testing.T) {
	for i := range 30 {
		addr := testAddr()
		ln, err := Listen("sandirect", addr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Dial("sandirect", addr)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
		exchange(t, c, s)
		c.Close()
		s.Close()
		waitTorn(t, c)
		waitTorn(t, s)
		if t.Failed() {
			t.Fatalf("round %d", i)
		}
	}
}
