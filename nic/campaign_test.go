package nic

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
)

// TestDeregisterAfterClose: a region deregistered after its device closed
// (a connection torn down after its last sibling closed the device) is
// released without touching the unmapped registration table: no panic,
// and its pages are unlocked.
func TestDeregisterAfterClose(t *testing.T) {
	for _, access := range []Access{AccessLocalWrite, AccessRemoteRead, AccessLocalWrite | AccessRemoteWrite} {
		d, err := Open(nil)
		if err != nil {
			t.Fatal(err)
		}
		before := vmLocked(t)
		buf := make([]byte, 64<<10)
		mr := register(t, d, buf, access)
		d.Close()
		if err := d.Deregister(mr); err != nil {
			t.Fatalf("access %v: Deregister after Close: %v", access, err)
		}
		if after := vmLocked(t); after > before {
			t.Fatalf("access %v: locked memory %d kB before, %d kB after", access, before, after)
		}
	}
}

// TestPeerTableReadOnly: the registration table of a peer (a real child
// process) is mapped read-only here: a write to it faults, so not even a
// bug of ours can change which keys the peer honours.
func TestPeerTableReadOnly(t *testing.T) {
	e, _, _, _ := dialTarget(t, "segment", 4096, true)
	mem := e.qp.peer.table.mem
	if len(mem) == 0 {
		t.Fatal("no peer table mapped")
	}
	before := mem[len(mem)-1]
	faulted := func() (fault bool) {
		old := debug.SetPanicOnFault(true)
		defer func() {
			debug.SetPanicOnFault(old)
			if r := recover(); r != nil {
				if _, ok := r.(runtime.Error); !ok {
					panic(r)
				}
				t.Logf("write to the peer's table: %v", r)
				fault = true
			}
		}()
		mem[len(mem)-1] = before + 1
		return false
	}()
	if !faulted || mem[len(mem)-1] != before {
		t.Fatal("wrote into the peer's registration table")
	}
	// Nor can the fd we hold be mapped writable: the owner sealed it.
	seg := e.qp.peer.tableSeg
	if !seg.WritesSealed() {
		t.Fatal("the peer's registration table is not sealed against writes")
	}
	if m, err := sys.MapShared(seg.Fd(), seg.Size(), false); err == nil {
		sys.Munmap(m)
		t.Fatal("mapped the peer's registration table writable")
	}
}

// TestLocalBufferVanishes unmaps the source of a large RDMA Write into
// device memory (a plain copy) while the engine copies it: the write
// completes with an error — the fault is recovered — and the process
// lives on.
func TestLocalBufferVanishes(t *testing.T) {
	a, b := pair(t, nil, nil)
	const size = 256 << 20
	dst, err := b.d.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer b.d.Free(dst)
	dmr := register(t, b.d, dst, AccessLocalWrite|AccessRemoteWrite)
	defer b.d.Deregister(dmr)
	for try := 0; ; try++ {
		src, err := sys.MapAnon(size)
		if err != nil {
			t.Fatal(err)
		}
		smr := register(t, a.d, src, 0)
		if err := a.qp.PostSend(SendWR{Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(dmr.Addr), RKey: dmr.RKey}); err != nil {
			t.Fatal(err)
		}
		if err := sys.Munmap(src); err != nil {
			t.Fatal(err)
		}
		c := wait(t, a.scq)
		a.d.Deregister(smr)
		if c.Status != StatusSuccess {
			t.Logf("write from a vanished buffer: %v", c.Err())
			return
		}
		if try == 4 {
			t.Skip("the copy always finished before the unmap")
		}
	}
}

// TestFlushKeepsOthersRegions: releasing one cache entry revokes nothing
// of a live region of another entry on the same pages. A connection's
// entry flushed while in use is released at its last Deregister; another
// connection's sink, registered on the same page meanwhile (two
// connections' buffers share a page of the Go heap), got a new entry —
// and lost its key at that release: its peer's RDMA Write failed with a
// remote access error (TestNettest, once connections flushed their
// entries at teardown).
func TestFlushKeepsOthersRegions(t *testing.T) {
	a, b := pair(t, nil, nil)
	if b.d.Cache() == nil {
		t.Skip("no registration cache")
	}
	page := make([]byte, 8192)
	old, err := b.d.RegisterFor(1, page[:100], AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.d.Flush(1); n != 1 { // in use: released at its Deregister
		t.Fatalf("Flush(1) took %d registrations, want 1", n)
	}
	sink, err := b.d.RegisterFor(2, page[400:500], AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer b.d.Deregister(sink)
	b.d.Deregister(old) // releases owner 1's entry
	src := make([]byte, 100)
	smr := register(t, a.d, src, 0)
	if err := a.qp.PostSend(SendWR{Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(sink.Addr), RKey: sink.RKey}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, a.scq); c.Status != StatusSuccess {
		t.Fatalf("write into a live region after another entry's release: %v", c.Err())
	}
}
