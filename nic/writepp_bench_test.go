package nic

import (
	"testing"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/shm"
)

// BenchmarkWritePingPong is an 8-byte RDMA Write ping-pong between two
// locked threads of this process, each polling its own device memory for
// the other's write and answering at once: write_lat's round trip across
// two cores, without a second process. "post" answers with PostSend and a
// poll of the send CQ, as the rdma suite's loop does; "store" with a plain
// store into the mapped target, the floor the post is measured against.
func BenchmarkWritePingPong(b *testing.B) {
	for _, mode := range []string{"store", "post"} {
		b.Run(mode, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Wait = shm.WaitConfig{Mode: shm.WaitBusyPoll}
			a, p := pair(b, &cfg, &cfg)
			memA, memP := alloc(b, a.d, 4096), alloc(b, p.d, 4096)
			srcA, srcP := make([]byte, 64), make([]byte, 64)
			sA := register(b, a.d, srcA, AccessLocalWrite|AccessStable)
			sP := register(b, p.d, srcP, AccessLocalWrite|AccessStable)
			mrA := register(b, a.d, memA, AccessLocalWrite|AccessRemoteWrite)
			mrP := register(b, p.d, memP, AccessLocalWrite|AccessRemoteWrite)
			type side struct {
				qp     *QueuePair
				cq     *CompletionQueue
				wr     SendWR
				target []byte // the peer's memory, mapped here
			}
			sideA := side{a.qp, a.scq, SendWR{Op: OpWrite, Local: srcA[:8], LKey: sA.LKey, Remote: uint64(mrP.Addr), RKey: mrP.RKey}, nil}
			sideP := side{p.qp, p.scq, SendWR{Op: OpWrite, Local: srcP[:8], LKey: sP.LKey, Remote: uint64(mrA.Addr), RKey: mrA.RKey}, nil}
			for _, s := range []*side{&sideA, &sideP} {
				s.target = s.qp.mappedTarget(b, s.wr.RKey, s.wr.Remote, 8)
			}
			send := func(s *side, seq uint64) error {
				if mode == "store" {
					shm.StoreUint64(s.target, 0, seq)
					return nil
				}
				shm.StoreUint64(s.wr.Local, 0, seq)
				if err := s.qp.PostSend(s.wr); err != nil {
					return err
				}
				var c [1]Completion
				for s.cq.Poll(c[:]) == 0 {
				}
				return c[0].Err()
			}
			const stop = ^uint64(0)
			seq, last := uint64(0), uint64(0)
			testutil.PingPongThreads(b,
				func() error {
					seq++
					if err := send(&sideA, seq); err != nil {
						return err
					}
					for shm.LoadUint64(memA, 0) != seq {
						shm.Pause()
					}
					return nil
				},
				func() (bool, error) {
					v := shm.LoadUint64(memP, 0)
					for ; v == last; v = shm.LoadUint64(memP, 0) {
						shm.Pause()
					}
					if last = v; v == stop {
						return true, nil
					}
					return false, send(&sideP, v)
				},
				func() error { return send(&sideA, stop) })
		})
	}
}

// mappedTarget returns the peer's memory at [addr, addr+n) of key rkey as
// this process maps it: what an RDMA Write there stores into.
func (qp *QueuePair) mappedTarget(t testing.TB, rkey, addr uint64, n int) []byte {
	e, err := qp.peer.table.lookup(rkey, addr, uint64(n), AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	seg, err := qp.peer.segment(e.seg)
	if err != nil {
		t.Fatal(err)
	}
	off := e.segOff + (addr - e.addr)
	return seg.Bytes()[off : off+uint64(n)]
}
