package nic

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

func TestSendRecv(t *testing.T) {
	a, b := pair(t, nil, nil)
	rbuf := make([]byte, 4096)
	rmr := register(t, b.d, rbuf, AccessLocalWrite)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1000)
	smr := register(t, a.d, big, 0)
	msgs := [][]byte{[]byte("hello"), {}, bytes.Repeat([]byte{7}, 256), big[:4000]}
	// Sends before receives are posted wait in the ring.
	for i, m := range msgs {
		wr := SendWR{ID: uint64(i), Op: OpSend, Local: m}
		if len(m) > a.d.Attr().MaxInline {
			wr.LKey = smr.LKey
		}
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if c := wait(t, a.scq); c.Status != StatusSuccess || c.ID != uint64(i) || c.Bytes != len(m) {
			t.Fatalf("send completion %+v", c)
		}
	}
	for i, m := range msgs {
		if err := b.qp.PostRecv(RecvWR{ID: 100 + uint64(i), Buf: rbuf, LKey: rmr.LKey}); err != nil {
			t.Fatal(err)
		}
		c := wait(t, b.rcq)
		if c.Status != StatusSuccess || c.ID != 100+uint64(i) || c.Op != OpRecv || !bytes.Equal(rbuf[:c.Bytes], m) {
			t.Fatalf("recv %d: %+v", i, c)
		}
	}
	var total uint64
	for _, m := range msgs {
		total += uint64(len(m))
	}
	if st := a.qp.Stats(); st.Sends != uint64(len(msgs)) || st.BytesSent != total {
		t.Errorf("sender stats %+v", st)
	}
	b.qp.Close()
	if st := b.d.Stats(); st.Recvs != uint64(len(msgs)) || st.BytesReceived != total {
		t.Errorf("receiver device stats after close %+v", st)
	}
}

func TestRecvTooSmall(t *testing.T) {
	a, b := pair(t, nil, nil)
	rbuf := make([]byte, 8)
	rmr := register(t, b.d, rbuf, AccessLocalWrite)
	b.qp.PostRecv(RecvWR{ID: 1, Buf: rbuf, LKey: rmr.LKey})
	b.qp.PostRecv(RecvWR{ID: 2, Buf: rbuf, LKey: rmr.LKey})
	a.qp.PostSend(SendWR{Op: OpSend, Local: []byte("more than eight")})
	if c := wait(t, b.rcq); c.Status != StatusLocalLength || c.ID != 1 {
		t.Fatalf("completion %+v", c)
	}
	if c := wait(t, b.rcq); c.Status != StatusFlushed || c.ID != 2 {
		t.Fatalf("second receive not flushed: %+v", c)
	}
	if b.qp.State() != QPError {
		t.Fatalf("state %v", b.qp.State())
	}
	if err := b.qp.PostRecv(RecvWR{Buf: rbuf, LKey: rmr.LKey}); !errors.Is(err, ErrQPState) {
		t.Fatalf("post on error QP: %v", err)
	}
}

// TestRDMA runs RDMA Write and Read of several sizes against device memory
// (the shared-segment path) and Go memory (the cross-memory path).
func TestRDMA(t *testing.T) {
	for _, name := range []string{"segment", "cma", "segment/nt", "segment/nt/device-local"} {
		mem, _, _ := strings.Cut(name, "/")
		nt := strings.Contains(name, "/nt")                  // WR.NonTemporal
		devLocal := strings.HasSuffix(name, "/device-local") // local buffers in device memory
		t.Run(name, func(t *testing.T) {
			a, b := pair(t, nil, nil)
			const size = 3<<20 + 123
			var target []byte
			if mem == "segment" {
				target = alloc(t, b.d, size)
			} else {
				target = make([]byte, size)
			}
			tmr := register(t, b.d, target, AccessRemoteRead|AccessRemoteWrite|AccessLocalWrite)
			// dst has room for a read at an offset: the bytes around it
			// must stay untouched.
			src, dst := make([]byte, size), make([]byte, size+size/3)
			if devLocal {
				src, dst = alloc(t, a.d, size), alloc(t, a.d, size+size/3)
			}
			for i := range src {
				src[i] = byte(i * 7)
			}
			smr := register(t, a.d, src, 0)
			dmr := register(t, a.d, dst, AccessLocalWrite)
			for _, n := range []int{1, 8, 4096, 100000, size} {
				off := uint64(size - n)
				clear(target)
				if err := a.qp.PostSend(SendWR{ID: 1, Op: OpWrite, Local: src[:n], LKey: smr.LKey, Remote: uint64(tmr.Addr) + off, RKey: tmr.RKey, NonTemporal: nt}); err != nil {
					t.Fatal(err)
				}
				if c := wait(t, a.scq); c.Status != StatusSuccess || c.Bytes != n {
					t.Fatalf("write %d: %+v", n, c)
				}
				if !bytes.Equal(target[off:], src[:n]) {
					t.Fatalf("write %d: target differs", n)
				}
				clear(dst)
				if err := a.qp.PostSend(SendWR{ID: 2, Op: OpRead, Local: dst[n/3 : n/3+n], LKey: dmr.LKey, Remote: uint64(tmr.Addr) + off, RKey: tmr.RKey, NonTemporal: nt}); err != nil {
					t.Fatal(err)
				}
				if c := wait(t, a.scq); c.Status != StatusSuccess || c.Bytes != n {
					t.Fatalf("read %d: %+v", n, c)
				}
				if !bytes.Equal(dst[n/3:n/3+n], src[:n]) || !bytes.Equal(dst[:n/3], make([]byte, n/3)) || !bytes.Equal(dst[n/3+n:], make([]byte, len(dst)-n/3-n)) {
					t.Fatalf("read %d: data differs, or bytes around it were written", n)
				}
			}
		})
	}
}

// TestRemoteAccessErrors checks every protection failure: the operation
// completes with StatusRemoteAccess, the QP enters the error state, and
// the guard bytes around the target stay untouched.
func TestRemoteAccessErrors(t *testing.T) {
	cases := []struct {
		name   string
		access Access
		mutate func(wr *SendWR, mr *MemoryRegion, d *Device)
	}{
		{"wrong rkey", AccessRemoteWrite, func(wr *SendWR, mr *MemoryRegion, d *Device) { wr.RKey ^= 1 << 40 }},
		{"zero rkey", AccessRemoteWrite, func(wr *SendWR, mr *MemoryRegion, d *Device) { wr.RKey = 0 }},
		{"index beyond table", AccessRemoteWrite, func(wr *SendWR, mr *MemoryRegion, d *Device) { wr.RKey |= maxRegEntries - 1 }},
		{"before region", AccessRemoteWrite, func(wr *SendWR, mr *MemoryRegion, d *Device) { wr.Remote-- }},
		{"past region", AccessRemoteWrite, func(wr *SendWR, mr *MemoryRegion, d *Device) { wr.Remote++ }},
		{"read-only region", AccessRemoteRead, func(wr *SendWR, mr *MemoryRegion, d *Device) {}},
		{"revoked", AccessRemoteWrite, func(wr *SendWR, mr *MemoryRegion, d *Device) { d.Deregister(mr) }},
		{"address wraps", AccessRemoteWrite, func(wr *SendWR, mr *MemoryRegion, d *Device) { wr.Remote = ^uint64(0) - 2 }},
	}
	for _, mem := range []string{"segment", "cma"} {
		for _, c := range cases {
			t.Run(mem+"/"+c.name, func(t *testing.T) {
				a, b := pair(t, nil, nil)
				var area []byte
				if mem == "segment" {
					area = alloc(t, b.d, 3*4096)
				} else {
					area = make([]byte, 3*4096)
				}
				for i := range area {
					area[i] = 0xee
				}
				target := area[4096 : 2*4096]
				mr := register(t, b.d, target, c.access)
				src := bytes.Repeat([]byte{1}, 4096)
				smr := register(t, a.d, src, 0)
				wr := SendWR{ID: 9, Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(mr.Addr), RKey: mr.RKey}
				c.mutate(&wr, mr, b.d)
				if err := a.qp.PostSend(wr); err != nil {
					t.Fatal(err)
				}
				comp := wait(t, a.scq)
				if comp.Status != StatusRemoteAccess {
					t.Fatalf("completion %+v, want remote access error", comp)
				}
				if a.qp.State() != QPError {
					t.Fatalf("QP state %v", a.qp.State())
				}
				for i, v := range area {
					if v != 0xee {
						t.Fatalf("byte %d of the target area written", i)
					}
				}
			})
		}
	}
}

func TestNoRDMARead(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NoRDMARead = true
	a, b := pair(t, &cfg, nil)
	if b.qp.PeerAttr().RDMARead || !a.qp.PeerAttr().RDMARead {
		t.Fatalf("attributes not exchanged: %+v %+v", a.qp.PeerAttr(), b.qp.PeerAttr())
	}
	dst := make([]byte, 64)
	mr := register(t, a.d, dst, AccessLocalWrite)
	err := a.qp.PostSend(SendWR{Op: OpRead, Local: dst, LKey: mr.LKey, Remote: 1, RKey: 1})
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("RDMA Read on a device without it: %v", err)
	}
}

func TestLocalKeyChecks(t *testing.T) {
	a, _ := pair(t, nil, nil)
	buf := make([]byte, 8192)
	mr := register(t, a.d, buf[:4096], 0)
	cases := []SendWR{
		{Op: OpSend, Local: buf[:1000], LKey: mr.LKey + 1},
		{Op: OpSend, Local: buf[4000:5000], LKey: mr.LKey},
		{Op: OpRead, Local: buf[:10], LKey: mr.LKey, RKey: 1}, // no local write
		{Op: OpRecv},
	}
	for i, wr := range cases {
		if err := a.qp.PostSend(wr); err == nil {
			t.Errorf("case %d: posted", i)
		}
	}
	if err := a.qp.PostRecv(RecvWR{Buf: buf[:10], LKey: mr.LKey}); !errors.Is(err, ErrBadKey) {
		t.Errorf("receive into a region without local write: %v", err)
	}
}

func TestCloseFlushesPeer(t *testing.T) {
	a, b := pair(t, nil, nil)
	rbuf := make([]byte, 64)
	rmr := register(t, b.d, rbuf, AccessLocalWrite)
	b.qp.PostRecv(RecvWR{ID: 5, Buf: rbuf, LKey: rmr.LKey})
	a.qp.Close()
	c := wait(t, b.rcq)
	if c.Status != StatusFlushed || c.ID != 5 {
		t.Fatalf("completion %+v", c)
	}
	if !errors.Is(b.qp.Err(), ErrPeerGone) {
		t.Fatalf("peer state: %v", b.qp.Err())
	}
}

func TestUnmapRevokes(t *testing.T) {
	a, b := pair(t, nil, nil)
	if b.d.Cache() == nil {
		t.Skip("no pinning")
	}
	t.Logf("monitor: %v", b.d.Cache().Monitor())
	buf, err := sys.MapAnon(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	mr := register(t, b.d, buf, AccessRemoteWrite)
	src := make([]byte, 4096)
	smr := register(t, a.d, src, 0)
	wr := SendWR{Op: OpWrite, Local: src, LKey: smr.LKey, Remote: uint64(mr.Addr), RKey: mr.RKey}
	if err := a.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, a.scq); c.Status != StatusSuccess {
		t.Fatalf("write before unmap: %+v", c)
	}
	if err := sys.Munmap(buf); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, a.scq); c.Status == StatusSuccess {
		t.Fatalf("write after unmap succeeded: %+v", c)
	} else {
		t.Logf("write after unmap: %v", c.Err())
	}
	b.d.Deregister(mr)
}

// TestRecvQueueBounded keeps receives posted all the time while messages
// flow: the receive queue must not grow with the number of messages.
func TestRecvQueueBounded(t *testing.T) {
	a, b := pair(t, nil, nil)
	buf := make([]byte, 64)
	mr := register(t, b.d, buf, AccessLocalWrite)
	for range 4 {
		b.qp.PostRecv(RecvWR{Buf: buf, LKey: mr.LKey})
	}
	for i := 0; i < 10000; i++ {
		if err := a.qp.PostSend(SendWR{Op: OpSend, Local: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		wait(t, a.scq)
		if c := wait(t, b.rcq); c.Status != StatusSuccess {
			t.Fatalf("%+v", c)
		}
		if err := b.qp.PostRecv(RecvWR{Buf: buf, LKey: mr.LKey}); err != nil {
			t.Fatal(err)
		}
	}
	b.qp.rqMu.Lock()
	n := cap(b.qp.rq)
	b.qp.rqMu.Unlock()
	if n > 256 {
		t.Fatalf("receive queue capacity %d after 10,000 messages with 4 posted", n)
	}
}

func TestWakeInterruptsWait(t *testing.T) {
	for _, mode := range []shm.WaitMode{shm.WaitBlock, shm.WaitBusyPoll, shm.WaitAdaptive} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Wait = shm.WaitConfig{Mode: mode}
			a, _ := pair(t, &cfg, nil)
			done := make(chan error, 1)
			go func() {
				var c [1]Completion
				n, err := a.rcq.Wait(c[:], time.Now().Add(20*time.Second))
				if err == nil && n != 0 {
					err = errors.New("a completion out of nowhere")
				}
				done <- err
			}()
			a.rcq.Wake()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Wake did not interrupt Wait")
			}
		})
	}
}
