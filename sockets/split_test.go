package sockets

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// streamSplits writes msgs messages of size bytes from one buffer, its
// contents new each time, and reads each into one guarded buffer; it
// checks every byte and the guards, and returns both sides' counters.
func streamSplits(t *testing.T, w, r net.Conn, size, msgs int, readDeadline bool) (wst, rst Counters) {
	t.Helper()
	src := make([]byte, size)
	dst := newGuarded(size)
	errc := make(chan error, 1)
	go func() {
		for m := range msgs {
			for i := range src {
				src[i] = byte(i*7 + m)
			}
			if _, err := w.Write(src); err != nil {
				errc <- fmt.Errorf("write %d: %w", m, err)
				return
			}
		}
		errc <- nil
	}()
	for m := range msgs {
		if readDeadline {
			r.SetReadDeadline(time.Now().Add(time.Minute))
		}
		if _, err := io.ReadFull(r, dst.mid); err != nil {
			t.Fatalf("read %d: %v", m, err)
		}
		for i, b := range dst.mid {
			if b != byte(i*7+m) {
				t.Fatalf("message %d, byte %d: %#x, want %#x", m, i, b, byte(i*7+m))
			}
		}
		if err := dst.intact(false); err != nil {
			t.Fatalf("message %d: %v", m, err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return w.(*Conn).Stats(), r.(*Conn).Stats()
}

// TestSplitTransfers: large writes from a reused buffer into a reused
// Read buffer go as split transfers, with the buffers put into huge pages
// for real (MADV_COLLAPSE): the reader reads the head, the writer writes
// the tail, and every byte arrives in place, none around it.
func TestSplitTransfers(t *testing.T) {
	probe := bytes.Repeat([]byte{1}, 4*sys.HugePage)
	if _, err := sys.CollapseHuge(probe); errors.Is(err, sys.EINVAL) {
		t.Skip("no transparent huge pages here (MADV_COLLAPSE):", err)
	}
	for _, mode := range []shm.WaitMode{shm.WaitBusyPoll, shm.WaitBlock} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := &Config{Wait: shm.WaitConfig{Mode: mode}}
			w, r := pipe(t, cfg, cfg)
			defer w.Close()
			defer r.Close()
			// The first write copies (a new buffer), in pieces, each read
			// into the Read buffer with a registration of its own; every
			// later one is offered split and taken. A declined offer would
			// leave the writer offering none for splitRetry, and whether
			// the stream outlasted that would decide the rest. Between 6
			// and 8 MiB a rendezvous's part of either buffer holds at
			// least two whole huge pages wherever the heap put it, at
			// least half of it (hugeBacked); just under 6 MiB it may hold
			// one, and neither side would split.
			size := 7<<20 + 123
			msgs := 4 + scaled(8)
			wst, rst := streamSplits(t, w, r, size, msgs, false)
			t.Logf("writer: %d split offers, %d tail bytes; reader: %d splits", wst.ZeroSplit, wst.BytesSplitTail, rst.Splits)
			if rst.Splits == 0 || wst.BytesSplitTail == 0 || wst.ZeroSplit < rst.Splits {
				t.Fatalf("%d split offers, %d splits, %d tail bytes", wst.ZeroSplit, rst.Splits, wst.BytesSplitTail)
			}
			if rst.Splits != wst.ZeroSplit || rst.Splits != uint64(msgs-1) {
				t.Fatalf("%d writes after the first, %d offered split, %d taken", msgs-1, wst.ZeroSplit, rst.Splits)
			}
			if tail := wst.BytesSplitTail / rst.Splits; tail < uint64(size)/3 || tail > uint64(size)/2+4096 {
				t.Fatalf("tail of %d bytes per split transfer of %d", tail, size)
			}
		})
	}
}

// TestSplitNeedsVersion3: a peer of version 2 is never offered a split.
func TestSplitNeedsVersion3(t *testing.T) {
	splitAnyMemory(t)
	w, r := pipe(t, &Config{SplitMin: 16 << 10}, &Config{SplitMin: 16 << 10, versions: [2]uint16{1, 2}})
	defer w.Close()
	defer r.Close()
	wst, rst := streamSplits(t, w, r, 512<<10, 8, false)
	if wst.ZeroSplit != 0 || rst.Splits != 0 {
		t.Fatalf("version %d: %d split offers, %d splits", w.(*Conn).version, wst.ZeroSplit, rst.Splits)
	}
}

// TestSplitNotWithReadDeadline: a Read with a deadline splits nothing —
// the sender's tail must land before Read returns, and a deadline could
// return it first — but the transfers arrive whole.
func TestSplitNotWithReadDeadline(t *testing.T) {
	splitAnyMemory(t)
	cfg := &Config{SplitMin: 16 << 10}
	w, r := pipe(t, cfg, cfg)
	defer w.Close()
	defer r.Close()
	wst, rst := streamSplits(t, w, r, 512<<10, 8, true)
	if rst.Splits != 0 || wst.BytesSplitTail != 0 {
		t.Fatalf("with a read deadline: %d splits, %d tail bytes", rst.Splits, wst.BytesSplitTail)
	}
	if wst.ZeroSplit == 0 {
		t.Fatal("no split offered: the test tests nothing")
	}
}

// TestSplitDoneChecks: the dones of a split transfer are checked against
// what is outstanding — the tail's on the receiving side, the final one on
// the sending side.
func TestSplitDoneChecks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		set    func(c *Conn)
		done   func(h *header)
		reason string
	}{
		{"tail of another range", func(c *Conn) {
			c.rd = recvOp{active: true, read: true, direct: true, split: true, id: 0, n: 8192, tailOff: 4096, tailLen: 4096}
		}, func(h *header) { h.SetFlags(flagSplit); h.SetOffset(0); h.SetSize(8192) }, "split done of transfer 0 [0, +8192), expected 0 [4096, +4096)"},
		{"tail twice", func(c *Conn) {
			c.rd = recvOp{active: true, read: true, direct: true, split: true, tailDone: true, id: 0, n: 8192, tailOff: 4096, tailLen: 4096}
		}, func(h *header) { h.SetFlags(flagSplit); h.SetOffset(4096); h.SetSize(4096) }, "split done of transfer 0"},
		{"tail of a transfer not split", func(c *Conn) {
			c.rd = recvOp{active: true, read: true, direct: true, id: 0, n: 8192}
		}, func(h *header) { h.SetFlags(flagSplit); h.SetOffset(4096); h.SetSize(4096) }, "split done of transfer 0"},
		{"final done before the tail", func(c *Conn) {
			c.txq = append(c.txq, &txfer{id: 0, read: true, size: 8192, split: true, tailAsked: true})
		}, func(h *header) { h.SetSize(8192) }, "done of split transfer 0 before its tail was written"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := pipe(t, nil, nil)
			defer s.Close()
			sc := c.(*Conn)
			sc.mu.Lock()
			tc.set(sc)
			h := hdr(msgDone, func(h *header) { h.SetID(0) })
			tc.done(&h)
			sc.onDoneLocked(&h)
			err := sc.err
			sc.rd, sc.txq = recvOp{}, nil
			sc.mu.Unlock()
			if !errors.Is(err, ErrProtocol) || !bytes.Contains([]byte(err.Error()), []byte(tc.reason)) {
				t.Fatalf("%v, want a protocol error with %q", err, tc.reason)
			}
			c.Close()
		})
	}
}
