package nic

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sandirect/sandirect/internal/testutil"
)

// TestPeerSegmentsMappedOnce connects many queue pairs between two devices
// and checks that each device's registration table and memory segment is
// mapped once by the other, however many queue pairs received it, that no
// fd of a peer's segment stays open, that every queue pair reaches the
// peer's memory through the shared mapping, and that closing them all
// gives everything back.
func TestPeerSegmentsMappedOnce(t *testing.T) {
	const n = 8
	a, b := openDevice(t, nil), openDevice(t, nil)
	dst := alloc(t, a, 64<<10) // each device's one memory segment is announced to every queue pair
	dmr := register(t, a, dst, AccessLocalWrite|AccessRemoteWrite)
	src := alloc(t, b, 4096)
	smr := register(t, b, src, 0)
	ln, err := a.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	imported := importedSegments()
	before := testutil.Snapshot()

	var qas, qbs []*QueuePair
	scq, rcq := b.NewCQ(), b.NewCQ()
	for range n {
		accepted := make(chan *QueuePair, 1)
		go func() {
			qp, err := ln.Accept(QPOptions{SendCQ: a.NewCQ(), RecvCQ: a.NewCQ()})
			if err != nil {
				t.Error(err)
			}
			accepted <- qp
		}()
		qb, err := b.Dial(ln.Addr().String(), QPOptions{SendCQ: scq, RecvCQ: rcq})
		if err != nil {
			t.Fatal(err)
		}
		qa := <-accepted
		if qa == nil {
			t.FailNow()
		}
		qas, qbs = append(qas, qa), append(qbs, qb)
	}
	// Every queue pair of b writes into a's device memory: each needs the
	// segment its own peer announced.
	for i, qb := range qbs {
		for j := range src {
			src[j] = byte(i + j)
		}
		off := uint64(i * 4096)
		if err := qb.PostSend(SendWR{ID: uint64(i), Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(dmr.Addr) + off, RKey: dmr.RKey}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, scq); c.Status != StatusSuccess || !bytes.Equal(dst[off:off+4096], src) {
			t.Fatalf("RDMA Write over queue pair %d: %+v", i, c)
		}
	}
	// Both tables and both memory segments: four peer mappings in all.
	if got := importedSegments() - imported; got != 4 {
		t.Errorf("%d peer segments mapped for %d queue pairs, want 4 (two tables, two memory segments)", got, n)
	}
	now := testutil.Snapshot()
	var memfds int
	for _, f := range now.Fds {
		if strings.Contains(f, "memfd:") {
			memfds++
		}
	}
	for _, f := range before.Fds {
		if strings.Contains(f, "memfd:") {
			memfds--
		}
	}
	if memfds != 0 {
		t.Errorf("%d more memfd fds open with %d queue pairs: peers' segments and queue pair memory need no fd", memfds, n)
	}
	// Each queue pair maps its own rings, on both sides; the rest is shared.
	if got, want := len(now.Mappings)-len(before.Mappings), 2*n+4; got != want {
		t.Errorf("%d more shared mappings with %d queue pairs, want %d:\n%s", got, n, want, strings.Join(now.Mappings, "\n"))
	}
	for i := range n {
		qas[i].Close()
		qbs[i].Close()
	}
	if got := importedSegments(); got != imported {
		t.Errorf("%d peer segments mapped after closing every queue pair, want %d", got, imported)
	}
	if err := before.CheckLeaks(); err != nil {
		t.Error(err)
	}
}
