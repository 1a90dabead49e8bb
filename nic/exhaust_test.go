package nic

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/pin"
)

// TestManyConnections opens 1,000 queue pairs between two devices, checks
// that each carries a message, and closes them all (TestMain then checks
// that no fd or mapping is left).
func TestManyConnections(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	cfg := DefaultConfig()
	cfg.RingCapacity = 4096 // small rings: 1,000 of them
	cfg.MaxInline = 64
	a, b := openDevice(t, &cfg), openDevice(t, &cfg)
	ln, err := b.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acq, bcq := a.NewCQ(), b.NewCQ()
	rbuf := make([]byte, 64)
	rmr := register(t, b, rbuf, AccessLocalWrite)
	var client, server []*QueuePair
	defer func() {
		for _, qp := range append(client, server...) {
			qp.Close()
		}
	}()
	for i := 0; i < n; i++ {
		done := make(chan *QueuePair, 1)
		go func() {
			qp, err := ln.Accept(QPOptions{SendCQ: bcq, RecvCQ: bcq})
			if err != nil {
				t.Error(err)
			}
			done <- qp
		}()
		qp, err := a.Dial(ln.Addr().String(), QPOptions{SendCQ: acq, RecvCQ: acq})
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		client = append(client, qp)
		s := <-done
		if s == nil {
			t.FailNow()
		}
		server = append(server, s)
	}
	var c [16]Completion
	for i, qp := range client {
		if err := server[i].PostRecv(RecvWR{ID: uint64(i), Buf: rbuf, LKey: rmr.LKey}); err != nil {
			t.Fatal(err)
		}
		if err := qp.PostSend(SendWR{ID: uint64(i), Op: OpSend, Local: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
		acq.Wait(c[:1], time.Now().Add(10*time.Second))
		got := 0
		for got == 0 {
			k, err := bcq.Wait(c[:1], time.Now().Add(10*time.Second))
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
			got = k
		}
		if c[0].ID != uint64(i) || c[0].Status != StatusSuccess || string(rbuf[:c[0].Bytes]) != fmt.Sprint(i) {
			t.Fatalf("connection %d: %+v %q", i, c[0], rbuf[:c[0].Bytes])
		}
	}
}

// TestFdExhaustion runs out of file descriptors while connecting: the
// failing Dial returns an error, leaks nothing, and connecting works again
// once descriptors are free.
func TestFdExhaustion(t *testing.T) {
	cur, _, err := sys.NofileLimit()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.RingCapacity = 4096
	cfg.MaxInline = 64
	a, b := openDevice(t, &cfg), openDevice(t, &cfg)
	ln, err := b.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acq, bcq := a.NewCQ(), b.NewCQ()
	accepted := make(chan *QueuePair, 1024)
	go func() {
		for {
			qp, err := ln.Accept(QPOptions{SendCQ: bcq, RecvCQ: bcq})
			if errors.Is(err, ErrClosed) {
				close(accepted)
				return
			}
			if err == nil {
				accepted <- qp
			}
		}
	}()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	open := len(ents)
	if err := sys.SetNofileLimit(uint64(open + 60)); err != nil {
		t.Fatal(err)
	}
	defer sys.SetNofileLimit(cur)
	var qps []*QueuePair
	var dialErr error
	for i := 0; i < 100 && dialErr == nil; i++ {
		var qp *QueuePair
		if qp, dialErr = a.Dial(ln.Addr().String(), QPOptions{SendCQ: acq, RecvCQ: acq, Timeout: 2 * time.Second}); dialErr == nil {
			qps = append(qps, qp)
		}
	}
	if dialErr == nil {
		t.Fatal("100 connections within 60 fds")
	}
	t.Logf("after %d connections: %v", len(qps), dialErr)
	if !errors.Is(dialErr, syscall.EMFILE) && !errors.Is(dialErr, ErrProtocol) && !errors.Is(dialErr, ErrRefused) {
		t.Logf("(error does not name EMFILE: %v)", dialErr)
	}
	for _, qp := range qps {
		qp.Close()
	}
	sys.SetNofileLimit(cur)
	qp, err := a.Dial(ln.Addr().String(), QPOptions{SendCQ: acq, RecvCQ: acq})
	if err != nil {
		t.Fatalf("no recovery: %v", err)
	}
	qp.Close()
	ln.Close()
	for s := range accepted {
		s.Close()
	}
}

// TestPinBudgetENOBUFS: registrations beyond the pinning budget fail with
// ENOBUFS, nothing is left half-registered, and they work again once
// memory is released.
func TestPinBudgetENOBUFS(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Pin = &pin.Config{MaxPinnedBytes: 1 << 20, Monitor: pin.MonitorOwned}
	d := openDevice(t, &cfg)
	big := make([]byte, 768<<10)
	more := make([]byte, 512<<10)
	mr, err := d.RegisterRemote(big, AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Register(more, 0); !errors.Is(err, syscall.ENOBUFS) {
		t.Fatalf("over budget: %v, want ENOBUFS", err)
	}
	if err := d.Deregister(mr); err != nil {
		t.Fatal(err)
	}
	mr2, err := d.Register(more, 0)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	d.Deregister(mr2)
}

// TestRegistrationTableFull: a device hands out its table's every index
// once, lowest first, refuses one region more with ENOBUFS naming the
// full table, and reuses the index a deregistration frees, the last freed
// first.
func TestRegistrationTableFull(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxRegions = 16
	d := openDevice(t, &cfg)
	bufs := make([][]byte, cfg.MaxRegions+1)
	for i := range bufs {
		bufs[i] = make([]byte, 64)
	}
	mrs := make([]*MemoryRegion, cfg.MaxRegions)
	for i := range mrs {
		mr, err := d.Register(bufs[i], AccessLocalWrite)
		if err != nil {
			t.Fatalf("region %d of %d: %v", i+1, cfg.MaxRegions, err)
		}
		if mr.LKey != uint32(i)+1 {
			t.Fatalf("region %d: lkey %d, want %d (indices lowest first)", i+1, mr.LKey, i+1)
		}
		mrs[i] = mr
	}
	_, err := d.Register(bufs[cfg.MaxRegions], AccessLocalWrite)
	if !errors.Is(err, syscall.ENOBUFS) || !strings.Contains(err.Error(), "registration table full (16 regions)") {
		t.Fatalf("one region more: %v, want ENOBUFS naming the full table", err)
	}
	for _, i := range []int{5, 9} {
		if err := d.Deregister(mrs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []uint32{10, 6} {
		mr, err := d.Register(bufs[cfg.MaxRegions], AccessLocalWrite)
		if err != nil {
			t.Fatalf("after deregistrations: %v", err)
		}
		if mr.LKey != want {
			t.Fatalf("lkey %d after deregistrations, want %d", mr.LKey, want)
		}
		defer d.Deregister(mr)
	}
	if _, err := d.Register(bufs[cfg.MaxRegions], AccessLocalWrite); !errors.Is(err, syscall.ENOBUFS) {
		t.Fatalf("full again: %v, want ENOBUFS", err)
	}
	for i, mr := range mrs {
		if i != 5 && i != 9 {
			if err := d.Deregister(mr); err != nil {
				t.Fatal(err)
			}
		}
	}
}
