package nic

import "testing"

// Flush(owner) unpins what owner left cached, and nothing of others.
func TestRegisterForFlush(t *testing.T) {
	d := openDevice(t, nil)
	if d.Cache() == nil {
		t.Skip("no registration cache")
	}
	mine, theirs := make([]byte, 1<<20), make([]byte, 1<<20)
	base := d.Cache().Stats().PinnedBytes
	for _, r := range []struct {
		owner Owner
		buf   []byte
	}{{7, mine}, {NoOwner, theirs}} {
		mr, err := d.RegisterFor(r.owner, r.buf, AccessLocalWrite|AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		if mr.RKey == 0 {
			t.Fatal("remote access asked, no rkey")
		}
		if err := d.Deregister(mr); err != nil {
			t.Fatal(err)
		}
	}
	cached := d.Cache().Stats().PinnedBytes
	if cached < base+2<<20 {
		t.Fatalf("pinned %d after deregistering, %d before: nothing cached", cached, base)
	}
	if n := d.Flush(7); n != 1 {
		t.Fatalf("Flush(7) released %d registrations, want 1", n)
	}
	after := d.Cache().Stats().PinnedBytes
	if after > cached-1<<20 || after < base+1<<20 {
		t.Fatalf("pinned %d after Flush(7), %d before it, %d at the start: want exactly owner 7's megabyte gone", after, cached, base)
	}
	if n := d.Flush(NoOwner); n != 0 {
		t.Fatalf("Flush(NoOwner) released %d: shared registrations are not flushed by owner", n)
	}
}

// A region keeps its key when an older registration of the same memory —
// flushed while in use, so a newer one pinned the pages anew — lets go:
// only the regions pinned through a range lose their keys with it.
func TestFlushedRangeRevokesOnlyItsRegions(t *testing.T) {
	a, p := pair(t, nil, nil)
	if p.d.Cache() == nil {
		t.Skip("no registration cache")
	}
	dst := make([]byte, 64<<10)
	old, err := p.d.RegisterFor(7, dst, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	p.d.Flush(7) // in use: dies at its deregistration, never handed out again
	live, err := p.d.RegisterFor(8, dst, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.d.Deregister(old); err != nil {
		t.Fatal(err)
	}
	src := []byte("still reachable")
	smr := register(t, a.d, src, 0)
	if err := a.qp.PostSend(SendWR{ID: 1, Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(live.Addr), RKey: live.RKey}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, a.scq); c.Err() != nil {
		t.Fatalf("RDMA Write to the live region: %v", c.Err())
	}
	if string(dst[:len(src)]) != string(src) {
		t.Fatalf("target holds %q", dst[:len(src)])
	}
}

// When the memory under a region in use changes (the cache invalidates its
// range), peers lose access to it at once, before its holder deregisters.
func TestInvalidationRevokesInUseRegion(t *testing.T) {
	a, p := pair(t, nil, nil)
	if p.d.Cache() == nil {
		t.Skip("no registration cache")
	}
	dst := make([]byte, 64<<10)
	mr := register(t, p.d, dst, AccessLocalWrite|AccessRemoteWrite)
	src := make([]byte, 16)
	smr := register(t, a.d, src, 0)
	write := func() Completion {
		if err := a.qp.PostSend(SendWR{ID: 1, Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(mr.Addr), RKey: mr.RKey}); err != nil {
			t.Fatal(err)
		}
		return wait(t, a.scq)
	}
	if c := write(); c.Err() != nil {
		t.Fatalf("before the invalidation: %v", c.Err())
	}
	p.d.Cache().Invalidate(mr.Addr, uintptr(mr.Len))
	if c := write(); c.Status != StatusRemoteAccess {
		t.Fatalf("after the invalidation: %+v, want %v", c, StatusRemoteAccess)
	}
	if err := p.d.Deregister(mr); err != nil {
		t.Fatalf("the holder's deregistration: %v", err)
	}
}
