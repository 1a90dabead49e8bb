package nic

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// TestPeerSegmentsMappedOnce connects many queue pairs between two devices
// and checks that each device's registration table and memory segment is
// mapped once by the other, however many queue pairs received it, that no
// fd of a peer's segment stays open, that every queue pair reaches the
// peer's memory through the shared mapping, that closing them all leaves
// the mappings parked, and that closing the devices gives everything
// back.
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
	// The dialer keeps the fds of this many queue-pair segments for reuse
	// (qppool.go), and drops the others' as before.
	const kept = 4
	defer maxKeptQPFds.Store(maxKeptQPFds.Load())
	maxKeptQPFds.Store(kept)

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
	// b's memory segment is announced to every queue pair of a too, which
	// need not have mapped it yet (its fd open meanwhile): wait for that.
	for _, qa := range qas {
		awaitPeerSegments(t, qa, 1)
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
	if memfds != kept {
		t.Errorf("%d more memfd fds open with %d queue pairs, want %d: peers' segments need no fd, and the dialer keeps those of at most %d queue-pair segments", memfds, n, kept, kept)
	}
	// Each queue pair maps its own rings, on both sides; the rest is
	// shared: the four segments above, and each side's map of the other's
	// wake hub.
	if got, want := len(now.Mappings)-len(before.Mappings), 2*n+4+2; got != want {
		t.Errorf("%d more shared mappings with %d queue pairs, want %d:\n%s", got, n, want, strings.Join(now.Mappings, "\n"))
	}
	for i := range n {
		qas[i].Close()
		qbs[i].Close()
	}
	if got := importedSegments() - imported; got != 4 {
		t.Errorf("%d peer segments mapped after closing every queue pair, want the 4 parked", got)
	}
	ln.Close()
	a.Close()
	b.Close()
	if got := importedSegments(); got != imported {
		t.Errorf("%d peer segments mapped after closing both devices, want %d", got, imported)
	}
	if err := before.CheckLeaks(); err != nil {
		t.Error(err)
	}
}

// TestParkedImports: a device keeps its peer's table, hub and memory
// segments mapped after its last queue pair to that peer closes, and the
// next queue pair takes them over without mapping anything; they go when
// importLinger passes with no queue pair using them.
func TestParkedImports(t *testing.T) {
	defer func(d time.Duration) { importLinger = d }(importLinger)
	importLinger = time.Hour
	a, b := openDevice(t, nil), openDevice(t, nil)
	alloc(t, a, 4096) // a memory segment, announced to b's queue pairs
	ln, err := a.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	imported := importedSegments()
	connect := func() (qa, qb *QueuePair) {
		t.Helper()
		accepted := make(chan *QueuePair, 1)
		go func() {
			qp, err := ln.Accept(QPOptions{SendCQ: a.NewCQ(), RecvCQ: a.NewCQ()})
			if err != nil {
				t.Error(err)
			}
			accepted <- qp
		}()
		qb, err := b.Dial(ln.Addr().String(), QPOptions{SendCQ: b.NewCQ(), RecvCQ: b.NewCQ()})
		if err != nil {
			t.Fatal(err)
		}
		if qa = <-accepted; qa == nil {
			t.FailNow()
		}
		awaitPeerSegments(t, qb, 1)
		return qa, qb
	}
	qa, qb := connect()
	table, note, seg := qb.peer.tableSeg, qb.note, qb.peer.segs[0]
	qa.Close()
	qb.Close()
	if got := importedSegments() - imported; got != 3 {
		t.Fatalf("%d peer segments mapped once the queue pairs closed, want the 3 parked (two tables, a's memory)", got)
	}
	before := testutil.Snapshot()
	qa, qb = connect()
	if qb.peer.tableSeg != table || qb.note != note || qb.peer.segs[0] != seg {
		t.Errorf("the second queue pair mapped its peer's table, hub or segment again instead of taking the parked ones")
	}
	now := testutil.Snapshot()
	// Nothing new is mapped: the new queue pair runs on the first one's
	// rings too (qppool.go), which both ends kept.
	if got := len(now.Mappings) - len(before.Mappings); got != 0 || qb.Stats().SegmentsReused != 1 {
		t.Errorf("%d new shared mappings for a queue pair to a known peer (segment reused: %d), want none:\n%s", got, qb.Stats().SegmentsReused, strings.Join(now.Mappings, "\n"))
	}
	qa.Close()
	qb.Close()
	// Expiry: parked anew with a short linger, the mappings go when it
	// passes, though a sweep was armed an hour away.
	importLinger = time.Millisecond
	qa, qb = connect()
	qa.Close()
	qb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for importedSegments() != imported {
		if time.Now().After(deadline) {
			t.Fatalf("%d peer segments still mapped 10 s after their linger of 1 ms", importedSegments()-imported)
		}
		time.Sleep(time.Millisecond) // poll: the sweep timer's goroutine
	}
}

// TestFreedSegmentUnmappedByPeer: when a device frees memory, its peer
// unmaps the segment (SEG_DEL) instead of keeping the mapping until the
// queue pair closes, so a long connection over which a device allocates
// and frees memory does not grow its peer's mappings.
func TestFreedSegmentUnmappedByPeer(t *testing.T) {
	a, b := pair(t, nil, nil)
	if a.qp.peer.version != cmVersion || b.qp.peer.version != cmVersion {
		t.Fatalf("negotiated versions %d and %d, want %d", a.qp.peer.version, b.qp.peer.version, cmVersion)
	}
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i)
	}
	smr := register(t, a.d, src, 0)
	imported := importedSegments()
	before := testutil.Snapshot()
	// writeInto RDMA-Writes src into dst, which waits for dst's segment to
	// be announced.
	writeInto := func(dst []byte, mr *MemoryRegion) Completion {
		t.Helper()
		if err := a.qp.PostSend(SendWR{Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(mr.Addr), RKey: mr.RKey}); err != nil {
			t.Fatal(err)
		}
		return wait(t, a.scq)
	}
	const rounds = 5
	for i := range rounds {
		x := alloc(t, b.d, 64<<10)
		xmr := register(t, b.d, x, AccessLocalWrite|AccessRemoteWrite)
		if c := writeInto(x, xmr); c.Status != StatusSuccess || !bytes.Equal(x[:4096], src) {
			t.Fatalf("round %d: RDMA Write into device memory: %+v", i, c)
		}
		a.qp.awaitRetired() // the previous round's SEG_DEL came before x's SEG_ADD
		if got := importedSegments() - imported; got != 1 {
			t.Fatalf("round %d: %d peer segments mapped, want 1", i, got)
		}
		if err := b.d.Deregister(xmr); err != nil {
			t.Fatal(err)
		}
		if err := b.d.Free(x); err != nil {
			t.Fatal(err)
		}
	}
	// The last SEG_DEL is ahead of y's SEG_ADD on the connection socket:
	// once the write into y went through, the reader has dropped the
	// freed segments, and their unmapping has started.
	y := alloc(t, b.d, 4096)
	ymr := register(t, b.d, y, AccessLocalWrite|AccessRemoteWrite)
	if c := writeInto(y, ymr); c.Status != StatusSuccess {
		t.Fatalf("RDMA Write into new device memory: %+v", c)
	}
	a.qp.awaitRetired()
	if got := importedSegments() - imported; got != 1 {
		t.Errorf("%d peer segments mapped after %d were freed, want 1", got, rounds)
	}
	// y alone (b's mapping and a's): nothing of the freed segments.
	now := testutil.Snapshot()
	if got := memFiles(now.Mappings) - memFiles(before.Mappings); got != 1 {
		t.Errorf("%d more device memory files mapped after %d segments were allocated and freed, want 1:\n%s", got, rounds, strings.Join(now.Mappings, "\n"))
	}
	a.qp.peer.segMu.Lock()
	n := len(a.qp.peer.segs)
	// The copies' lock-free cache of segments holds none of the freed
	// ones: a copy must never find an unmapped segment there.
	for i := range a.qp.peer.hot {
		if h := a.qp.peer.hot[i].Load(); h != nil && a.qp.peer.segs[h.idx] != h.seg {
			t.Errorf("the hot segment cache holds segment %d, which the peer freed", h.idx)
		}
	}
	a.qp.peer.segMu.Unlock()
	if n != 1 {
		t.Errorf("the queue pair knows %d peer segments, want 1", n)
	}
}

// TestSegDelOfUnknownSegment: a SEG_DEL for a segment the peer never
// announced is a protocol error.
func TestSegDelOfUnknownSegment(t *testing.T) {
	a, b := pair(t, nil, nil)
	sendCM(t, a, cmSegDel, 777)
	awaitProtocolError(t, b, "never announced")
}

// memFiles counts the device memory files among /proc/self/maps lines (a
// file's mappings may show as several lines).
func memFiles(mappings []string) int {
	inodes := map[string]bool{}
	for _, l := range mappings {
		if f := strings.Fields(l); len(f) >= 6 && strings.Contains(l, "sandirect:mem") {
			inodes[f[3]+" "+f[4]] = true
		}
	}
	return len(inodes)
}

// TestQueuePairMemoryLazy: a connected, idle queue pair's rings take
// memory for the pages it touched, not the whole segment, on either side
// (shm.CreateSegmentLazy, OpenSegmentLazy).
func TestQueuePairMemoryLazy(t *testing.T) {
	a, b := pair(t, nil, nil)
	size := len(a.qp.seg.Bytes())
	for _, e := range []*end{a, b} {
		n, err := testutil.ResidentKiB(e.qp.seg.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if n*1024 >= size/2 {
			t.Errorf("an idle queue pair's segment: %d KiB of %d resident", n, size/1024)
		}
	}
}

// awaitPeerSegments waits until qp has mapped n memory segments its peer
// announced (10 s at most).
func awaitPeerSegments(t *testing.T, qp *QueuePair, n int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		qp.peer.segMu.Lock()
		got, changed := len(qp.peer.segs), qp.peer.segChanged
		qp.peer.segMu.Unlock()
		if got >= n {
			return
		}
		if changed == nil {
			t.Fatalf("queue pair failed with %d of %d peer segments", got, n)
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("%d of %d peer segments after 10 s", got, n)
		}
	}
}
