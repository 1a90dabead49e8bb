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
