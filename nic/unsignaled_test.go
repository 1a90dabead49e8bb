package nic

import (
	"errors"
	"testing"
	"time"

	"github.com/sandirect/sandirect/shm"
)

// Unsignaled sends that succeed leave no completion; the receiver gets
// every one, in order, and a signaled send after them completes alone.
func TestUnsignaledSend(t *testing.T) {
	a, b := pair(t, nil, nil)
	const n = 100
	bufs := make([]byte, n*16)
	mr := register(t, b.d, bufs, AccessLocalWrite)
	for i := range n {
		if err := b.qp.PostRecv(RecvWR{ID: uint64(i), Buf: bufs[i*16 : i*16+16], LKey: mr.LKey}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n - 1 {
		if err := a.qp.PostSend(SendWR{ID: uint64(i), Op: OpSend, Local: []byte{byte(i)}, Unsignaled: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.qp.PostSend(SendWR{ID: 999, Op: OpSend, Local: []byte{n - 1}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		c := wait(t, b.rcq)
		if c.Err() != nil || c.ID != uint64(i) || c.Bytes != 1 || bufs[i*16] != byte(i) {
			t.Fatalf("receive %d: %+v, byte %d", i, c, bufs[i*16])
		}
	}
	if c := wait(t, a.scq); c.ID != 999 || c.Err() != nil {
		t.Fatalf("send completion %+v, want the signaled one (id 999)", c)
	}
	var c [4]Completion
	if k := a.scq.Poll(c[:]); k != 0 {
		t.Fatalf("%d more send completions: %+v", k, c[:k])
	}
}

// An unsignaled send that fails still completes, with its error: here the
// peer's ring stays full until the receiver-not-ready timeout.
func TestUnsignaledSendFailureCompletes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RingCapacity = shm.MinRingCapacity
	cfg.MaxInline = 64
	cfg.RNRTimeout = 50 * time.Millisecond
	a, _ := pair(t, &cfg, &cfg)
	msg := make([]byte, cfg.MaxInline)
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("the peer's ring never filled")
		}
		if err := a.qp.PostSend(SendWR{ID: uint64(i), Op: OpSend, Local: msg, Unsignaled: true}); err != nil {
			t.Fatal(err)
		}
		if a.qp.sqLen.Load() > 0 { // queued: the ring is full
			break
		}
	}
	c := wait(t, a.scq)
	var ce *CompletionError
	if c.Status != StatusRNRRetryExceeded || !errors.As(c.Err(), &ce) {
		t.Fatalf("completion %+v, want %v", c, StatusRNRRetryExceeded)
	}
	if a.qp.State() != QPError {
		t.Fatalf("state %v after a failed send", a.qp.State())
	}
}
