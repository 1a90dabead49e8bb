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

// BenchmarkSendVsRing is an 8-byte ping-pong between two goroutines on
// threads pinned to CPUs 0 and 1, in rounds that alternate between two raw
// shm rings (the echo writes straight from the incoming record: the
// floor) and a queue pair with buffers in device memory (send_lat's
// path). On this VM the cross-core round trip changes 2-3x from one
// second to the next; within a round of a few milliseconds it holds, so
// the per-round ratio is what compares. Reported: the median of the
// rounds' ratios nic/ring, and the median one-way (half round trip) of
// each.
func BenchmarkSendVsRing(b *testing.B) {
	if runtime.NumCPU() < 2 {
		b.Skip("needs two CPUs")
	}
	const perRound = 5000 // round trips of each kind per round
	busy := shm.WaitConfig{Mode: shm.WaitBusyPoll}

	// The rings.
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

	// The queue pair.
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

	var phase atomic.Int64 // round r runs when phase is r+1; -1 stops the echo
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer pinnedThread(b, 1)()
		var c [1]Completion
		for r := int64(1); ; r++ {
			for ph := phase.Load(); ph != r; ph = phase.Load() {
				if ph < 0 {
					return
				}
			}
			for range perRound {
				if r%2 == 1 {
					rec, err := ca.Next(time.Time{})
					if err != nil {
						return
					}
					pb.Write(rec.Tag, rec.Data, time.Time{})
					ca.Release()
					continue
				}
				if k, err := p.rcq.Wait(c[:], time.Time{}); k != 1 || err != nil {
					return
				}
				i := c[0].ID
				buf := bufP[i*64 : i*64+64]
				p.qp.PostSend(SendWR{Op: OpSend, Local: buf[:c[0].Bytes], LKey: mrP.LKey, Unsignaled: true})
				p.qp.PostRecv(RecvWR{ID: i, Buf: buf, LKey: mrP.LKey})
			}
		}
	}()
	defer func() { phase.Store(-1); <-done }()
	defer pinnedThread(b, 0)()

	msg, out := make([]byte, 8), make([]byte, 8)
	ringRound := func() time.Duration {
		t0 := time.Now()
		for range perRound {
			pa.Write(1, msg, time.Time{})
			rec, err := cb.Next(time.Time{})
			if err != nil {
				b.Fatal(err)
			}
			copy(out, rec.Data)
			cb.Release()
		}
		return time.Since(t0)
	}
	var c [1]Completion
	wr := SendWR{Op: OpSend, Local: bufA[:8], LKey: mrA.LKey, Unsignaled: true}
	nicRound := func() time.Duration {
		t0 := time.Now()
		a.qp.PostSend(wr)
		for i := range perRound {
			if k, err := a.rcq.Wait(c[:], time.Time{}); k != 1 || err != nil {
				b.Fatal(k, err)
			}
			if i+1 < perRound {
				a.qp.PostSend(wr)
			}
			id := c[0].ID
			a.qp.PostRecv(RecvWR{ID: id, Buf: bufA[id*64 : id*64+64], LKey: mrA.LKey})
		}
		return time.Since(t0)
	}
	var ratios, rings, nics []float64
	r := int64(0)
	for b.Loop() {
		r++
		phase.Store(r)
		tr := ringRound()
		r++
		phase.Store(r)
		tn := nicRound()
		ratios = append(ratios, float64(tn)/float64(tr))
		rings = append(rings, float64(tr.Nanoseconds())/perRound/2)
		nics = append(nics, float64(tn.Nanoseconds())/perRound/2)
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(median(ratios), "nic/ring")
	b.ReportMetric(median(rings), "ring-ns/one-way")
	b.ReportMetric(median(nics), "nic-ns/one-way")
	b.ReportMetric(0, "ns/op")
}
