package nic

import (
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/shm"
)

// The hostile child dials args[0] like any client, then lies: it tries to
// shrink and grow the queue-pair segment it made (the seals forbid it),
// sends a few honest messages, and then writes random words over both rings
// of the segment, args[1] of them, and waits to be killed.
func init() {
	testutil.RegisterChild("hostile", func(args []string) error {
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		d, err := Open(nil)
		if err != nil {
			return err
		}
		defer d.Close()
		qp, err := d.Dial(args[0], QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ()})
		if err != nil {
			return err
		}
		for _, size := range []int64{0, int64(qp.seg.Size()) * 2} {
			if err := sys.Ftruncate(qp.seg.Fd(), size); err == nil {
				return errors.New("resized a sealed queue-pair segment")
			}
		}
		for range 3 {
			if err := qp.PostSend(SendWR{Op: OpSend, Local: []byte("honest")}); err != nil {
				return err
			}
		}
		mem := qp.seg.Bytes()
		rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 1))
		for i := 0; i < n; i++ {
			off := qpRingsOff + rng.IntN((len(mem)-qpRingsOff)/8)*8
			// Leave the closed flags: this is corruption, not a close.
			if r := (off - qpRingsOff) % (len(mem) / 2); r >= 16 && r < 24 {
				continue
			}
			shm.StoreUint64(mem, off, rng.Uint64())
		}
		os.Stdout.WriteString("scribbled\n")
		select {} // until killed; the socket stays open
	})
}

// TestHostilePeer: a peer that scribbles over the shared rings makes its own
// connection fail with an error — never a panic, never a hang — while a
// healthy connection on the same device carries on.
func TestHostilePeer(t *testing.T) {
	d := openDevice(t, nil)
	ln, err := d.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	child := testutil.StartChild(t, "hostile", nil, ln.Addr().String(), "100000")
	scq, rcq := d.NewCQ(), d.NewCQ()
	victim, err := ln.Accept(QPOptions{SendCQ: scq, RecvCQ: rcq})
	if err != nil {
		t.Fatalf("accept: %v\n%s", err, child.Output())
	}
	defer victim.Close()

	// A healthy pair on the same device, in this process.
	good := &end{d: openDevice(t, nil)}
	good.scq, good.rcq = good.d.NewCQ(), good.d.NewCQ()
	accepted := make(chan *QueuePair, 1)
	go func() {
		qp, err := ln.Accept(QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ()})
		if err != nil {
			t.Error(err)
		}
		accepted <- qp
	}()
	if good.qp, err = good.d.Dial(ln.Addr().String(), QPOptions{SendCQ: good.scq, RecvCQ: good.rcq}); err != nil {
		t.Fatal(err)
	}
	defer good.qp.Close()
	server := <-accepted
	defer server.Close()

	buf := make([]byte, 1<<16)
	mr := register(t, d, buf, AccessLocalWrite)
	deadline := time.Now().Add(20 * time.Second)
	var failure error
	for failure == nil && time.Now().Before(deadline) {
		if err := victim.PostRecv(RecvWR{Buf: buf, LKey: mr.LKey}); err != nil {
			failure = err
			break
		}
		var c [1]Completion
		n, err := rcq.Wait(c[:], time.Now().Add(100*time.Millisecond))
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			failure = err
		} else if n == 1 && c[0].Status != StatusSuccess {
			failure = c[0].Err()
		}
	}
	if failure == nil {
		t.Fatalf("the scribbled connection never failed\n%s", child.Output())
	}
	t.Logf("victim connection failed with: %v", failure)
	if victim.State() != QPError {
		t.Fatalf("victim state %v", victim.State())
	}
	// The healthy connection still works.
	rbuf := make([]byte, 64)
	rmr := register(t, d, rbuf, AccessLocalWrite)
	server.PostRecv(RecvWR{ID: 7, Buf: rbuf, LKey: rmr.LKey})
	if err := good.qp.PostSend(SendWR{Op: OpSend, Local: []byte("still fine")}); err != nil {
		t.Fatal(err)
	}
	var c [1]Completion
	for n := 0; n == 0; {
		if n, err = server.recvCQ.Wait(c[:], time.Now().Add(10*time.Second)); err != nil {
			t.Fatalf("healthy connection: %v", err)
		}
	}
	if c[0].Status != StatusSuccess || string(rbuf[:c[0].Bytes]) != "still fine" {
		t.Fatalf("healthy connection: %+v", c[0])
	}
	child.Kill()
}
