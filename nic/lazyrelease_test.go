package nic

import (
	"bytes"
	"testing"
)

// TestLazyRelease: a poller that gets all the completions it asked for
// leaves the ring space of small messages unreleased (its reply goes out
// first); its next progress, or a waiter about to sleep, releases it; a
// large message is released at once.
func TestLazyRelease(t *testing.T) {
	a, b := pair(t, nil, nil)
	buf := alloc(t, b.d, 64<<10)
	mr := register(t, b.d, buf, AccessLocalWrite)
	post := func(id uint64) {
		t.Helper()
		if err := b.qp.PostRecv(RecvWR{ID: id, Buf: buf[id*16<<10 : (id+1)*16<<10], LKey: mr.LKey}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(m []byte) {
		t.Helper()
		if err := a.qp.PostSend(SendWR{Op: OpSend, Local: m, Unsignaled: len(m) <= a.d.Attr().MaxInline, LKey: 0}); err != nil {
			t.Fatal(err)
		}
	}
	pollOne := func() Completion {
		t.Helper()
		var c [1]Completion
		for b.rcq.Poll(c[:]) == 0 {
		}
		if c[0].Status != StatusSuccess {
			t.Fatalf("receive: %+v", c[0])
		}
		return c[0]
	}
	unreleased := func() int {
		b.qp.rqMu.Lock()
		defer b.qp.rqMu.Unlock()
		return b.qp.in.Unreleased()
	}

	post(0)
	post(1)
	send([]byte("first"))
	send([]byte("second"))
	pollOne()
	if unreleased() == 0 {
		t.Fatal("a poller that got what it asked for released at once")
	}
	pollOne()
	if n := unreleased(); n == 0 || n > lazyRelease {
		t.Fatalf("%d bytes unreleased after two small messages", n)
	}
	post(2) // its progress finds the ring empty and releases
	if n := unreleased(); n != 0 {
		t.Fatalf("%d bytes unreleased after a PostRecv", n)
	}
	var c [1]Completion
	send([]byte("third"))
	pollOne()
	post(0)
	if b.rcq.Poll(c[:]) != 0 {
		t.Fatal("a completion from nowhere")
	}
	if n := unreleased(); n != 0 {
		t.Fatalf("%d bytes unreleased after a poll that found nothing", n)
	}

	// A waiter about to sleep releases what a poller held.
	send([]byte("fourth"))
	pollOne()
	if unreleased() == 0 {
		t.Fatal("no lazy release to test")
	}
	b.qp.releaseLazy()
	if n := unreleased(); n != 0 {
		t.Fatalf("%d bytes unreleased after a waiter's check", n)
	}

	// A large message goes back at once.
	post(3)
	b.qp.releaseLazy()
	big := bytes.Repeat([]byte{9}, 8<<10)
	if err := a.qp.PostSend(SendWR{Op: OpSend, Local: big, LKey: register(t, a.d, big, 0).LKey}); err != nil {
		t.Fatal(err)
	}
	if c := pollOne(); c.Bytes != len(big) || !bytes.Equal(buf[3*16<<10:3*16<<10+len(big)], big) {
		t.Fatalf("large receive %+v", c)
	}
	if n := unreleased(); n != 0 {
		t.Fatalf("%d bytes of a large message unreleased", n)
	}
}
