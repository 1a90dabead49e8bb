package nic

import (
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// pinnedThread locks the calling goroutine to a thread on cpu; the
// returned function undoes it.
func pinnedThread(tb testing.TB, cpu int) func() {
	runtime.LockOSThread()
	restore, err := sys.PinThread(cpu)
	if err != nil {
		runtime.UnlockOSThread()
		tb.Skipf("pin to CPU %d: %v", cpu, err)
	}
	return func() { restore(); runtime.UnlockOSThread() }
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
// On this VM the cross-core round trip changes 2-3x from one second to the
// next; within a round of a few milliseconds it holds, so the per-round
// ratio is what compares. Each layer reports the median of its rounds'
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
	wr := SendWR{Op: OpSend, Local: bufA[:8], LKey: mrA.LKey, Unsignaled: true}
	// Errors end the round early; the result is then meaningless, not
	// wrong, and the next layer's round still runs.
	layers := []struct {
		name       string
		ping, echo func()
	}{
		{"ring", func() {
			pa.Write(1, msg, time.Time{})
			if rec, err := cb.Next(time.Time{}); err == nil {
				copy(out, rec.Data)
			}
			cb.Release()
		}, func() {
			if rec, err := ca.Next(time.Time{}); err == nil {
				pb.Write(rec.Tag, rec.Data, time.Time{})
			}
			ca.Release()
		}},
		{"qpring", func() {
			a.qp.out.Write(tagSend, msg, time.Time{})
			if rec, err := a.qp.in.Next(time.Time{}); err == nil {
				copy(out, rec.Data)
			}
			a.qp.in.Release()
		}, func() {
			if rec, err := p.qp.in.Next(time.Time{}); err == nil {
				p.qp.out.Write(rec.Tag, rec.Data, time.Time{})
			}
			p.qp.in.Release()
		}},
		{"post", func() {
			a.qp.PostSend(wr)
			if rec, err := a.qp.in.Next(time.Time{}); err == nil {
				copy(out, rec.Data)
			}
			a.qp.in.Release()
		}, func() {
			if rec, err := p.qp.in.Next(time.Time{}); err == nil {
				n := copy(bufP, rec.Data)
				p.qp.PostSend(SendWR{Op: OpSend, Local: bufP[:n], LKey: mrP.LKey, Unsignaled: true})
			}
			p.qp.in.Release()
		}},
		{"nic", func() {
			a.qp.PostSend(wr)
			a.rcq.Wait(c[:], time.Time{})
			id := c[0].ID % slots
			a.qp.PostRecv(RecvWR{ID: id, Buf: bufA[id*64 : id*64+64], LKey: mrA.LKey})
		}, func() {
			p.rcq.Wait(pc[:], time.Time{})
			i := pc[0].ID % slots
			buf := bufP[i*64 : i*64+64]
			p.qp.PostSend(SendWR{Op: OpSend, Local: buf[:min(pc[0].Bytes, 64)], LKey: mrP.LKey, Unsignaled: true})
			p.qp.PostRecv(RecvWR{ID: i, Buf: buf, LKey: mrP.LKey})
		}},
	}
	var phase atomic.Int64 // round r runs when phase is r; -1 stops the echo
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer pinnedThread(b, 1)()
		for r := int64(1); ; r++ {
			for ph := phase.Load(); ph != r; ph = phase.Load() {
				if ph < 0 {
					return
				}
			}
			l := layers[(r-1)%int64(len(layers))]
			for range perRound {
				l.echo()
			}
		}
	}()
	defer func() { phase.Store(-1); <-done }()
	defer pinnedThread(b, 0)()
	ratios := make([][]float64, len(layers))
	ns := make([][]float64, len(layers))
	r := int64(0)
	for b.Loop() {
		var ring float64
		for i, l := range layers {
			r++
			phase.Store(r)
			t0 := time.Now()
			for range perRound {
				l.ping()
			}
			one := float64(time.Since(t0).Nanoseconds()) / perRound / 2
			if i == 0 {
				ring = one
			}
			ns[i] = append(ns[i], one)
			ratios[i] = append(ratios[i], one/ring)
		}
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	for i, l := range layers {
		b.ReportMetric(median(ns[i]), l.name+"-ns")
		if i > 0 {
			b.ReportMetric(median(ratios[i]), l.name+"/ring")
		}
	}
	b.ReportMetric(0, "ns/op")
}
