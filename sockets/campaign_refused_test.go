package sockets

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/nic"
)

// A client that the listener's uid policy refuses (issue 21) hears why:
// the reason travels in the handshake's reject, and the client's error
// names the uid and whose policy refused it, instead of a reset. A uid
// 65534 child dials this root process's listener twice: with a nic
// device that admits uid 0 (so that only the listener refuses), and with
// a sockets Dialer (whose own policy refuses the listener first). The
// listener then still serves a client of its own uid.

func init() {
	testutil.RegisterChild("refused-dial", func(args []string) error {
		err := func() error {
			dev, err := nic.Open(&nic.Config{AllowUIDs: []uint32{0}})
			if err != nil {
				return err
			}
			defer dev.Close()
			cq := dev.NewCQ()
			qp, err := dev.Dial(args[0], nic.QPOptions{SendCQ: cq, RecvCQ: cq, Timeout: 10 * time.Second})
			if err == nil {
				qp.Close()
				return fmt.Errorf("the listener admitted uid %d", os.Getuid())
			}
			want := fmt.Sprintf("uid %d not allowed by the listener's policy", os.Getuid())
			if !errors.Is(err, nic.ErrRefused) || !strings.Contains(err.Error(), want) {
				return fmt.Errorf("refused with %q, want ErrRefused saying %q", err, want)
			}
			fmt.Println("listener refused:", err)
			_, err = Dial("sandirect", args[0])
			want = "uid 0 not allowed by the dialer's policy"
			if !errors.Is(err, nic.ErrRefused) || !strings.Contains(err.Error(), want) {
				return fmt.Errorf("sockets dial refused with %q, want ErrRefused saying %q", err, want)
			}
			fmt.Println("dialer refused:", err)
			return nil
		}()
		if err != nil {
			say("error " + err.Error())
			return err
		}
		say("ok")
		return nil
	})
}

func TestCampaignRefusedUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child as uid 65534")
	}
	base := takeBaseline(t)
	addr := testAddr()
	ln, err := (&ListenConfig{}).Listen(context.Background(), "sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	child := testutil.StartChildAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "refused-dial", []*os.File{w}, addr)
	w.Close()
	n := &notes{f: r, r: bufio.NewReader(r), child: child}
	n.wait(t, "ok")
	r.Close()
	if err := child.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Log(child.Output())
	// The listener carries on.
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	c, err := Dial("sandirect", addr)
	if err != nil {
		t.Fatalf("dial after the refusal: %v", err)
	}
	c.Close()
	if err := within(t, "accept", 10*time.Second, func() error { return <-done }); err != nil {
		t.Fatalf("accept after the refusal: %v", err)
	}
	ln.Close()
	waitTorn(t, c)
	base.check(t)
}
