package nic

import (
	"bytes"
	"errors"
	"testing"
)

// TestRDMARepeatChecks runs small RDMA Writes until the repeat path
// (postRDMARepeat) serves them, then changes one thing and posts again:
// every check the general path makes must still hold — the peer's range,
// access and key, and our own region — with the same outcome as a first
// request would have, and nothing written outside the target.
func TestRDMARepeatChecks(t *testing.T) {
	var repeats int
	testHookRDMARepeat = func() { repeats++ }
	t.Cleanup(func() { testHookRDMARepeat = nil })
	type env struct {
		wr       *SendWR
		rmr, smr *MemoryRegion
		a, b     *end
		src      []byte
	}
	// Each case changes one thing; local ones fail at PostSend with
	// ErrBadKey and leave the queue pair ready, remote ones complete with
	// a remote access error and move it to the error state.
	cases := []struct {
		name   string
		local  bool
		mutate func(e *env)
	}{
		{"before region", false, func(e *env) { e.wr.Remote = uint64(e.rmr.Addr) - 1 }},
		{"past region", false, func(e *env) { e.wr.Remote = uint64(e.rmr.Addr) + uint64(e.rmr.Len) - 7 }},
		{"address wraps", false, func(e *env) { e.wr.Remote = ^uint64(0) - 2 }},
		{"revoked", false, func(e *env) { e.b.d.Deregister(e.rmr) }},
		{"re-registered read-only", false, func(e *env) {
			buf := e.rmr.Buf()
			e.b.d.Deregister(e.rmr)
			register(t, e.b.d, buf, AccessRemoteRead)
		}},
		{"read of a write-only region", false, func(e *env) {
			e.wr.Op = OpRead
			e.wr.LKey = register(t, e.a.d, e.src, AccessLocalWrite).LKey
		}},
		{"other key", false, func(e *env) { e.wr.RKey ^= 1 << 40 }},
		{"local region deregistered", true, func(e *env) { e.a.d.Deregister(e.smr) }},
		{"local buffer outside its region", true, func(e *env) { e.wr.Local = make([]byte, 8) }},
	}
	setup := func(t *testing.T) (*env, []byte) {
		a, b := pair(t, nil, nil)
		area := alloc(t, b.d, 3*4096)
		for i := range area {
			area[i] = 0xee
		}
		rmr := register(t, b.d, area[4096:2*4096], AccessRemoteWrite)
		src := bytes.Repeat([]byte{1}, 64)
		smr := register(t, a.d, src, 0)
		wr := &SendWR{ID: 9, Op: OpWrite, Local: src[:8], LKey: smr.LKey, Remote: uint64(rmr.Addr), RKey: rmr.RKey}
		// Two writes: the first through the general path, which
		// validates and keeps the translation; the second must be
		// served by the repeat path.
		before := repeats
		for i := range 2 {
			wr.Remote = uint64(rmr.Addr) + uint64(8*i)
			if err := a.qp.PostSend(*wr); err != nil {
				t.Fatal(err)
			}
			if c := wait(t, a.scq); c.Status != StatusSuccess || c.Bytes != 8 {
				t.Fatalf("write %d: %+v", i, c)
			}
		}
		if repeats != before+1 {
			t.Fatalf("the repeat path served %d of two writes, want the second", repeats-before)
		}
		if !bytes.Equal(area[4096:4096+16], bytes.Repeat([]byte{1}, 16)) {
			t.Fatal("the writes did not land")
		}
		for i := 4096; i < 4096+16; i++ {
			area[i] = 0xee
		}
		return &env{wr: wr, rmr: rmr, smr: smr, a: a, b: b, src: src}, area
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, area := setup(t)
			c.mutate(e)
			before := repeats
			err := e.a.qp.PostSend(*e.wr)
			want := QPError
			if c.local {
				want = QPReady
				if !errors.Is(err, ErrBadKey) {
					t.Fatalf("PostSend: %v, want ErrBadKey", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if comp := wait(t, e.a.scq); comp.Status != StatusRemoteAccess {
					t.Fatalf("completion %+v, want a remote access error", comp)
				}
			}
			if repeats != before {
				t.Fatal("the repeat path served the changed request")
			}
			if e.a.qp.State() != want {
				t.Fatalf("QP state %v, want %v", e.a.qp.State(), want)
			}
			untouched(t, area)
		})
	}
}

// untouched fails t if any byte of area is not the guard value 0xee.
func untouched(t *testing.T, area []byte) {
	t.Helper()
	for i, v := range area {
		if v != 0xee {
			t.Fatalf("byte %d of the target area written", i)
		}
	}
}
