package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/mem"
)

// The floor suite's pipeline rows: what two cores can stream at all.
//
// Two threads of this process, pinned to the two CPUs, move messages of
// the size through a shared buffer of pipeSlots pieces of pipePiece bytes
// (sockets' default CopyChunk and MaxCopyInFlight): the writer copies a
// piece of its message in, the reader copies it out into its own message
// buffer — the two copies of any transport through shared memory, with no
// protocol at all. Transport pipeline/cached writes the pieces with copy,
// pipeline/nt with non-temporal stores (mem.CopyNT); pipeline/best is the
// faster of the two in this run. Which is faster depends on where the host
// puts the two vCPUs: cached pieces win when a cache line passes between
// them quickly, non-temporal ones when it does not (docs/performance.md).
// pipeline/best is the machine's ceiling for a cross-core stream at that
// moment: the conn suite's stream targets against copy() (one core, no
// transfer) cannot be met when it is below them.
const (
	pipePiece = 960 << 10
	pipeSlots = 4
)

// measurePipeline reports the pipeline rows for each of sizes.
func measurePipeline(ctx context.Context, env *Env, sizes []int) []Record {
	var out []Record
	for _, size := range sizes {
		var best Result
		for _, nt := range []bool{false, true} {
			if ctx.Err() != nil {
				return out
			}
			bw := pipelineRun(env, size, nt)
			name := "pipeline/cached"
			if nt {
				name = "pipeline/nt"
			}
			r := Result{Case: "stream", Transport: name, Size: size, HasBW: true,
				BW: bw.P50, BWMin: bw.Min, BWMax: bw.Max, Rate: bw.P50 * 1e3 / float64(size)}
			out = append(out, env.Report(r)...)
			if r.BW > best.BW {
				best = r
			}
		}
		if best.BW > 0 { // neither way measured: no best either
			best.Transport = "pipeline/best"
			out = append(out, env.Report(best)...)
		}
	}
	debug.FreeOSMemory()
	return out
}

// pipelineRun streams size-byte messages for about bwTime in batches and
// returns the spread of the batches' GB/s.
func pipelineRun(env *Env, size int, nt bool) bwSpread {
	// Its two threads spin for each other: with one processor
	// (GOMAXPROCS=1, a container's one CPU) they could only take turns.
	if runtime.GOMAXPROCS(0) < 2 && runtime.NumCPU() >= 2 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	clear(dst)
	slots := make([]byte, pipeSlots*pipePiece)
	clear(slots)
	var produced, consumed atomic.Int64 // pieces
	var stop, readerGone atomic.Bool
	done := make(chan struct{})
	go func() { // the reader
		defer close(done)
		defer readerGone.Store(true) // also when it could not be pinned
		pinned(env.cpus[1], func() error {
			for i := int64(0); ; i++ {
				for produced.Load() <= i {
					if stop.Load() {
						return nil
					}
				}
				off := int(i%pipeSlots) * pipePiece
				at, n := pieceOf(i, size)
				copy(dst[at:at+n], slots[off:off+n])
				consumed.Store(i + 1)
			}
		})
	}()
	var bws []float64
	pinned(env.cpus[0], func() error {
		i := int64(0)
		// write streams msgs messages; false when the reader is gone.
		write := func(msgs int) bool {
			for range msgs {
				for p := 0; p < (size+pipePiece-1)/pipePiece; p++ {
					for i-consumed.Load() >= pipeSlots {
						if readerGone.Load() {
							return false
						}
					}
					off := int(i%pipeSlots) * pipePiece
					at, n := pieceOf(i, size)
					if nt {
						mem.CopyNT(slots[off:off+n], src[at:at+n])
					} else {
						copy(slots[off:off+n], src[at:at+n])
					}
					produced.Store(i + 1)
					i++
				}
			}
			for consumed.Load() < i {
				if readerGone.Load() {
					return false
				}
			}
			return true
		}
		msgs := max(1, (64<<20)/size) // a batch: 64 MiB
		if !write(msgs) {             // warm-up
			return nil
		}
		start := time.Now()
		for len(bws) < 3 || time.Since(start) < env.plan.bwTime {
			t0 := time.Now()
			if !write(msgs) {
				bws = nil // the reader could not run: nothing to report
				return nil
			}
			gbps, _ := throughput(size, int64(msgs), time.Since(t0))
			bws = append(bws, gbps)
		}
		return nil
	})
	stop.Store(true)
	<-done
	return spreadOf(bws)
}

// pieceOf returns where piece i of the stream lies in its message of size
// bytes, and its length.
func pieceOf(i int64, size int) (at, n int) {
	per := int64((size + pipePiece - 1) / pipePiece)
	at = int(i%per) * pipePiece
	return at, min(pipePiece, size-at)
}
