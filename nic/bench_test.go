package nic

import (
	"testing"
	"time"

	"github.com/sandirect/sandirect/shm"
)

// BenchmarkSendPingPong is an 8-byte send ping-pong between two devices of
// this process (two goroutines, busy polling): the code path of send_lat.
func BenchmarkSendPingPong(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Wait = shm.WaitConfig{Mode: shm.WaitBusyPoll}
	a, p := pair(b, &cfg, &cfg)
	bufA, bufB := make([]byte, 64), make([]byte, 64)
	mrA, mrB := register(b, a.d, bufA, AccessLocalWrite), register(b, p.d, bufB, AccessLocalWrite)
	msg := make([]byte, 8)
	stop := make(chan struct{})
	go func() { // echo
		var c [4]Completion
		for {
			p.qp.PostRecv(RecvWR{Buf: bufB, LKey: mrB.LKey})
			for n := 0; n == 0; {
				select {
				case <-stop:
					return
				default:
				}
				n = p.rcq.Poll(c[:1])
			}
			p.qp.PostSend(SendWR{Op: OpSend, Local: bufB[:8]})
			p.scq.Poll(c[:])
		}
	}()
	var c [4]Completion
	b.ReportAllocs()
	for b.Loop() {
		a.qp.PostRecv(RecvWR{Buf: bufA, LKey: mrA.LKey})
		a.qp.PostSend(SendWR{Op: OpSend, Local: msg})
		for n := 0; n == 0; {
			n = a.rcq.Poll(c[:1])
		}
		a.scq.Poll(c[:])
	}
	close(stop)
	time.Sleep(time.Millisecond)
}

// BenchmarkSendSoftware is one 8-byte send each way between two devices
// of this process, driven by one goroutine: nothing waits or crosses a
// core, so it measures the software cost of post, progress and poll.
//
// Sub-benchmarks: the buffers in Go memory ("go"), whose copies run under
// fault protection, or in device memory ("device"), whose copies need none.
func BenchmarkSendSoftware(b *testing.B) {
	for _, where := range []string{"go", "device"} {
		b.Run(where, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Wait = shm.WaitConfig{Mode: shm.WaitBusyPoll}
			a, p := pair(b, &cfg, &cfg)
			alloc := func(d *Device) []byte {
				if where == "go" {
					return make([]byte, 64)
				}
				buf, err := d.Alloc(64)
				if err != nil {
					b.Fatal(err)
				}
				return buf
			}
			bufA, bufB := alloc(a.d), alloc(p.d)
			mrA, mrB := register(b, a.d, bufA, AccessLocalWrite), register(b, p.d, bufB, AccessLocalWrite)
			var c [4]Completion
			b.ReportAllocs()
			for b.Loop() {
				p.qp.PostRecv(RecvWR{Buf: bufB, LKey: mrB.LKey})
				a.qp.PostSend(SendWR{Op: OpSend, Local: bufA[:8], LKey: mrA.LKey, Unsignaled: true})
				for p.rcq.Poll(c[:1]) == 0 {
				}
				a.qp.PostRecv(RecvWR{Buf: bufA, LKey: mrA.LKey})
				p.qp.PostSend(SendWR{Op: OpSend, Local: bufB[:8], LKey: mrB.LKey, Unsignaled: true})
				for a.rcq.Poll(c[:1]) == 0 {
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/one-way")
		})
	}
}

// BenchmarkWriteSoftware is one 8-byte RDMA Write each way into the other
// device's memory, signaled, driven by one goroutine: the software cost of
// post, execute and completion (write_lat's path without the wire).
func BenchmarkWriteSoftware(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Wait = shm.WaitConfig{Mode: shm.WaitBusyPoll}
	a, p := pair(b, &cfg, &cfg)
	memA, err := a.d.Alloc(4096)
	if err != nil {
		b.Fatal(err)
	}
	memP, err := p.d.Alloc(4096)
	if err != nil {
		b.Fatal(err)
	}
	mrA := register(b, a.d, memA, AccessLocalWrite|AccessRemoteWrite)
	mrP := register(b, p.d, memP, AccessLocalWrite|AccessRemoteWrite)
	var c [4]Completion
	b.ReportAllocs()
	for b.Loop() {
		a.qp.PostSend(SendWR{Op: OpWrite, Local: memA[:8], LKey: mrA.LKey, Remote: uint64(mrP.Addr), RKey: mrP.RKey})
		for a.scq.Poll(c[:1]) == 0 {
		}
		p.qp.PostSend(SendWR{Op: OpWrite, Local: memP[:8], LKey: mrP.LKey, Remote: uint64(mrA.Addr), RKey: mrA.RKey})
		for p.scq.Poll(c[:1]) == 0 {
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/one-way")
}
