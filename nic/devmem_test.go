package nic

import (
	"bytes"
	"errors"
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
)

// TestDeviceMemoryFastCopies sends between buffers in device memory (the
// copies that skip fault protection) in both directions, inline and from a
// registered region, and RDMA-Writes from one, checking every byte.
func TestDeviceMemoryFastCopies(t *testing.T) {
	a, b := pair(t, nil, nil)
	src, dst := alloc(t, a.d, 64<<10), alloc(t, b.d, 64<<10)
	for i := range src {
		src[i] = byte(i * 7)
	}
	smr := register(t, a.d, src, 0)
	dmr := register(t, b.d, dst, AccessLocalWrite|AccessRemoteWrite)
	if !a.d.owns(smr) || !b.d.owns(dmr) {
		t.Fatal("regions in device memory are not seen as such")
	}
	for i, n := range []int{8, a.d.Attr().MaxInline, 4000, 60 << 10} {
		clear(dst)
		if err := b.qp.PostRecv(RecvWR{ID: uint64(i), Buf: dst, LKey: dmr.LKey}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(SendWR{ID: uint64(i), Op: OpSend, Local: src[:n], LKey: smr.LKey}); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, a.scq); c.Status != StatusSuccess {
			t.Fatalf("send of %d: %+v", n, c)
		}
		if c := wait(t, b.rcq); c.Status != StatusSuccess || c.Bytes != n || !bytes.Equal(dst[:n], src[:n]) {
			t.Fatalf("receive of %d: %+v, data equal %v", n, c, bytes.Equal(dst[:n], src[:n]))
		}
	}
	clear(dst)
	if err := a.qp.PostSend(SendWR{ID: 9, Op: OpWrite, Local: src[:5000], LKey: smr.LKey, Remote: uint64(dmr.Addr) + 100, RKey: dmr.RKey}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, a.scq); c.Status != StatusSuccess || !bytes.Equal(dst[100:5100], src[:5000]) || dst[99] != 0 || dst[5100] != 0 {
		t.Fatalf("RDMA Write from device memory: %+v", c)
	}
}

// TestFreeRequiresDeregister: Free refuses device memory that a region
// still uses, then frees it once the region is gone; a second Free fails.
func TestFreeRequiresDeregister(t *testing.T) {
	d := openDevice(t, nil)
	buf := alloc(t, d, 4096)
	mr := register(t, d, buf, AccessLocalWrite)
	if err := d.Free(buf); err == nil {
		t.Fatal("Free of registered device memory succeeded")
	}
	buf[0] = 1 // still mapped
	if err := d.Deregister(mr); err != nil {
		t.Fatal(err)
	}
	if d.owns(mr) {
		t.Fatal("a deregistered region is still trusted")
	}
	if err := d.Free(buf); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(buf); err == nil {
		t.Fatal("second Free succeeded")
	}
	if d.owns(register(t, d, make([]byte, 64), 0)) {
		t.Fatal("Go memory is trusted as device memory")
	}
	// Memory its owner promises to keep mapped is trusted while
	// registered, and only then.
	goBuf := make([]byte, 64)
	stable := register(t, d, goBuf, AccessStable)
	if !d.owns(stable) || !d.devMem(stable.LKey, goBuf[8:16]) {
		t.Fatal("memory registered with AccessStable gets fault protection")
	}
	if d.devMem(stable.LKey, make([]byte, 8)) {
		t.Fatal("a buffer outside the stable region is trusted")
	}
	if err := d.Deregister(stable); err != nil {
		t.Fatal(err)
	}
	if d.owns(stable) || d.devMem(stable.LKey, goBuf) {
		t.Fatal("a deregistered stable region is still trusted")
	}
}

// TestReceiveIntoFreedDeviceMemory posts a receive into device memory,
// deregisters and frees that memory, then sends: the receive completes
// with a local access error — its region is gone, which the nic checks
// before it copies, since the freed addresses may already be mapped again
// by something else (this test failed so under load) — and the process
// lives on.
func TestReceiveIntoFreedDeviceMemory(t *testing.T) {
	a, b := pair(t, nil, nil)
	buf := alloc(t, b.d, 4096)
	mr := register(t, b.d, buf, AccessLocalWrite)
	if err := b.qp.PostRecv(RecvWR{ID: 1, Buf: buf, LKey: mr.LKey}); err != nil {
		t.Fatal(err)
	}
	if err := b.d.Deregister(mr); err != nil {
		t.Fatal(err)
	}
	if err := b.d.Free(buf); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(SendWR{ID: 2, Op: OpSend, Local: []byte("into the void")}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, b.rcq); c.Status != StatusLocalAccess || c.ID != 1 {
		t.Fatalf("receive into freed memory: %+v", c)
	}
	if b.qp.State() != QPError {
		t.Fatalf("queue pair %v after a local access error", b.qp.State())
	}
}

// TestInlineSendFromVanishedBuffer posts an inline send whose buffer's
// pages are gone (inaccessible): PostSend returns, the send completes with a local access error
// (though unsignaled: failures always complete), the queue pair is in the
// error state, the process lives on, and the peer receives nothing.
func TestInlineSendFromVanishedBuffer(t *testing.T) {
	a, b := pair(t, nil, nil)
	rbuf := alloc(t, b.d, 4096)
	rmr := register(t, b.d, rbuf, AccessLocalWrite)
	if err := b.qp.PostRecv(RecvWR{ID: 7, Buf: rbuf, LKey: rmr.LKey}); err != nil {
		t.Fatal(err)
	}
	// The buffer's pages are made inaccessible, not unmapped: an unmapped
	// range can be mapped again by anyone in the process (the runtime, a
	// segment import) before the send copies it, and an unsignaled send
	// that succeeds completes nothing. The copy faults the same way.
	mem, err := sys.MapAnon(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Munmap(mem)
	if err := sys.ProtectNone(mem); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(SendWR{ID: 3, Op: OpSend, Local: mem[:64], Unsignaled: true}); err != nil {
		t.Fatalf("PostSend: %v (a fault completes, it is not a post error)", err)
	}
	if c := wait(t, a.scq); c.Status != StatusLocalAccess || c.ID != 3 {
		t.Fatalf("send from an unmapped buffer: %+v", c)
	}
	if a.qp.State() != QPError {
		t.Fatalf("queue pair %v after a local access error", a.qp.State())
	}
	if err := a.qp.PostSend(SendWR{ID: 4, Op: OpSend, Local: []byte("after")}); !errors.Is(err, ErrQPState) {
		t.Fatalf("PostSend on the failed queue pair: %v, want ErrQPState", err)
	}
	// The reserved record went out as a no-op, before the failure
	// completed: the peer's poll skips it and completes nothing; its
	// receive ends with the connection.
	var cs [1]Completion
	if n := b.rcq.Poll(cs[:]); n != 0 {
		t.Fatalf("the peer completed %+v for a send that faulted", cs[0])
	}
	a.qp.Close()
	if c := wait(t, b.rcq); c.Status == StatusSuccess || c.ID != 7 {
		t.Fatalf("the peer's receive after the sender closed: %+v", c)
	}
}
