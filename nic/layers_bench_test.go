package nic

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/shm"
)

// pinnedThread locks the calling goroutine to a thread on cpu; the
// returned function undoes it.
func pinnedThread(cpu int) (func(), error) {
	runtime.LockOSThread()
	restore, err := sys.PinThread(cpu)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("pin to CPU %d: %w", cpu, err)
	}
	return func() { restore(); runtime.UnlockOSThread() }, nil
}

// BenchmarkSendLayers is an 8-byte ping-pong between goroutines on
// threads pinned to CPUs 0 and 1, in rounds that alternate between layers,
// to find where a send's one-way time over the raw ring goes:
//
//   - ring: two raw shm rings, the echo writing straight from the
//     incoming record (the floor, and send_lat's reference);
//   - qpring: the queue pair's own rings, written and read raw (its ring
//     geometry and memory, no nic software);
//   - post: PostSend on both sides, the receive read raw from the ring
//     (the send path's cost);
//   - nic: PostSend, CompletionQueue.Wait and PostRecv (send_lat's path).
//
// On a VM the cross-core round trip can change severalfold from one
// second to the next (docs/performance.md); within a round of a few
// milliseconds it holds, so the per-round ratio is what compares. Each layer reports the median of its rounds'
// one-way times and of their ratios to the ring round before them
// (nic/ring is the ratio send_lat's target bounds).
func BenchmarkSendLayers(b *testing.B) {
	if runtime.NumCPU() < 2 {
		b.Skip("needs two CPUs")
	}
	const perRound = 5000
	busy := shm.WaitConfig{Mode: shm.WaitBusyPoll}
	const capacity = 64 << 10
	mem, err := sys.MapAnon(2 * shm.RingSize(capacity))
	if err != nil {
		b.Fatal(err)
	}
	defer sys.Munmap(mem)
	ra, rb := mem[:shm.RingSize(capacity)], mem[shm.RingSize(capacity):]
	for _, r := range [][]byte{ra, rb} {
		if err := shm.InitRing(r, capacity); err != nil {
			b.Fatal(err)
		}
	}
	pa, _ := shm.NewProducer(ra, busy)
	ca, _ := shm.NewConsumer(ra, busy)
	pb, _ := shm.NewProducer(rb, busy)
	cb, _ := shm.NewConsumer(rb, busy)

	cfg := DefaultConfig()
	cfg.Wait = busy
	a, p := pair(b, &cfg, &cfg)
	const slots = 16
	bufA, bufP := alloc(b, a.d, 64*slots), alloc(b, p.d, 64*slots)
	mrA := register(b, a.d, bufA, AccessLocalWrite)
	mrP := register(b, p.d, bufP, AccessLocalWrite)
	for i := range slots {
		a.qp.PostRecv(RecvWR{ID: uint64(i), Buf: bufA[i*64 : i*64+64], LKey: mrA.LKey})
		p.qp.PostRecv(RecvWR{ID: uint64(i), Buf: bufP[i*64 : i*64+64], LKey: mrP.LKey})
	}
	msg, out := make([]byte, 8), make([]byte, 8)
	var c, pc [1]Completion
	repost := -1 // the ping's receive to post again after its next send
	wr := SendWR{Op: OpSend, Local: bufA[:8], LKey: mrA.LKey, Unsignaled: true}
	layers := []testutil.Layer{
		{Name: "ring", Ping: func() error {
			if err := pa.Write(1, msg, time.Time{}); err != nil {
				return err
			}
			return readRaw(cb, out)
		}, Echo: func() error { return echoRaw(ca, pb) }},
		{Name: "qpring", Ping: func() error {
			if err := a.qp.out.Write(tagSend, msg, time.Time{}); err != nil {
				return err
			}
			return readRaw(a.qp.in, out)
		}, Echo: func() error { return echoRaw(p.qp.in, p.qp.out) }},
		{Name: "post", Ping: func() error {
			if err := a.qp.PostSend(wr); err != nil {
				return err
			}
			return readRaw(a.qp.in, out)
		}, Echo: func() error {
			rec, err := p.qp.in.Next(time.Time{})
			if err != nil {
				return err
			}
			n := copy(bufP, rec.Data)
			err = p.qp.PostSend(SendWR{Op: OpSend, Local: bufP[:n], LKey: mrP.LKey, Unsignaled: true})
			p.qp.in.Release()
			return err
		}},
		{Name: "nic", Ping: func() error {
			if err := a.qp.PostSend(wr); err != nil {
				return err
			}
			// The last receive's buffer goes back after the next send is
			// out, as send_lat's loop does: the repost overlaps the trip.
			if repost >= 0 {
				if err := a.qp.PostRecv(RecvWR{ID: uint64(repost), Buf: bufA[repost*64 : repost*64+64], LKey: mrA.LKey}); err != nil {
					return err
				}
			}
			if _, err := a.rcq.Wait(c[:], time.Time{}); err != nil {
				return err
			}
			if err := c[0].Err(); err != nil {
				return err
			}
			repost = int(c[0].ID)
			return nil
		}, Echo: func() error {
			if _, err := p.rcq.Wait(pc[:], time.Time{}); err != nil {
				return err
			}
			if err := pc[0].Err(); err != nil {
				return err
			}
			i := pc[0].ID
			buf := bufP[i*64 : i*64+64]
			if err := p.qp.PostSend(SendWR{Op: OpSend, Local: buf[:pc[0].Bytes], LKey: mrP.LKey, Unsignaled: true}); err != nil {
				return err
			}
			return p.qp.PostRecv(RecvWR{ID: i, Buf: buf, LKey: mrP.LKey})
		}},
	}
	testutil.AlternatingRounds(b, layers, perRound, func(echo bool) (func(), error) {
		if echo {
			return pinnedThread(1)
		}
		return pinnedThread(0)
	})
}

// readRaw reads the next record of in into out and releases it.
func readRaw(in *shm.Consumer, out []byte) error {
	rec, err := in.Next(time.Time{})
	if err != nil {
		return err
	}
	copy(out, rec.Data)
	in.Release()
	return nil
}

// echoRaw writes the next record of in back on out, straight from the ring.
func echoRaw(in *shm.Consumer, out *shm.Producer) error {
	rec, err := in.Next(time.Time{})
	if err != nil {
		return err
	}
	err = out.Write(rec.Tag, rec.Data, time.Time{})
	in.Release()
	return err
}
