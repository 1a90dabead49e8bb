package shm

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkRing measures one record through a ring: Write then Next and
// Release in the same goroutine (the cost of the code, without the cache
// line transfer between cores; the bench command measures that). It must
// not allocate.
func BenchmarkRing(b *testing.B) {
	for _, size := range []int{8, 64, 4096, 64 << 10} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			p, c := newRing(b, 1<<20, WaitConfig{Mode: WaitBusyPoll}, WaitConfig{Mode: WaitBusyPoll})
			msg := make([]byte, size)
			out := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Write(1, msg, time.Time{}); err != nil {
					b.Fatal(err)
				}
				rec, err := c.Next(time.Time{})
				if err != nil {
					b.Fatal(err)
				}
				copy(out, rec.Data)
				c.Release()
			}
		})
	}
}

// BenchmarkRingStream streams records from one goroutine to another, the
// consumer copying each out and releasing in batches.
func BenchmarkRingStream(b *testing.B) {
	for _, size := range []int{64, 4096, 64 << 10} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			p, c := newRing(b, 4<<20, WaitConfig{Mode: WaitBusyPoll}, WaitConfig{Mode: WaitBusyPoll})
			msg := make([]byte, size)
			done := make(chan error, 1)
			n := b.N
			go func() {
				out := make([]byte, size)
				for i := 0; i < n; i++ {
					rec, err := c.Next(time.Time{})
					if err != nil {
						done <- err
						return
					}
					copy(out, rec.Data)
					if i%16 == 15 {
						c.Release()
					}
				}
				c.Release()
				done <- nil
			}()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < n; i++ {
				buf, err := p.Reserve(size, time.Time{})
				if err != nil {
					b.Fatal(err)
				}
				copy(buf, msg)
				if err := p.Commit(1, size); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestRingNoAllocs pins the zero-allocation property as a test too (it
// counts allocations, not time).
func TestRingNoAllocs(t *testing.T) {
	p, c := newRing(t, 1<<16, WaitConfig{Mode: WaitBusyPoll}, WaitConfig{Mode: WaitBusyPoll})
	msg := make([]byte, 100)
	allocs := testing.AllocsPerRun(1000, func() {
		p.Write(1, msg, time.Time{})
		c.Next(time.Time{})
		c.Release()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per record", allocs)
	}
}
