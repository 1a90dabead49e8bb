package testutil

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// Layer is one kind of ping-pong of an alternating-rounds benchmark: Ping
// sends a message and waits for its echo, Echo waits for a message and
// sends it back.
type Layer struct {
	Name       string
	Ping, Echo func() error
}

// AlternatingRounds measures ping-pongs in rounds of perRound round trips
// that alternate between the layers, the echoes in a goroutine of their
// own. On a VM the cross-core round trip and the futex wake-up change
// severalfold from one second to the next, while within a round of a few
// milliseconds they hold: per-round ratios compare layers under the same
// conditions. Each layer reports NAME-ns, the median of its rounds' one-way
// times (half round trips), and every layer after the first NAME/FIRST, the
// median of its rounds' ratios to the first layer's round before them.
//
// thread, when not nil, is called first in the echo goroutine (echo true)
// and in the measuring one (false), and what it returns when each is done:
// to lock and pin their threads, say. If it fails, the benchmark is
// skipped with its error, before any round runs.
func AlternatingRounds(b *testing.B, layers []Layer, perRound int, thread func(echo bool) (func(), error)) {
	b.Helper()
	var phase atomic.Int64 // round r runs when phase is r; -1 ends the echoes
	ready := make(chan error, 1)
	done := make(chan error, 1)
	go echoRounds(layers, perRound, &phase, thread, ready, done)
	if err := <-ready; err != nil {
		b.Skip(err)
	}
	halves := make([][]float64, len(layers))
	ratios := make([][]float64, len(layers))
	func() {
		if thread != nil {
			undo, err := thread(false)
			if err != nil {
				phase.Store(-1)
				<-done
				b.Skip(err)
			}
			defer undo()
		}
		r := int64(0)
		for b.Loop() {
			var first float64
			for i, l := range layers {
				r++
				phase.Store(r)
				t0 := time.Now()
				for range perRound {
					if err := l.Ping(); err != nil {
						phase.Store(-1)
						b.Fatalf("%s: %v", l.Name, err)
					}
				}
				half := float64(time.Since(t0).Nanoseconds()) / float64(perRound) / 2
				if i == 0 {
					first = half
				}
				halves[i] = append(halves[i], half)
				ratios[i] = append(ratios[i], half/first)
			}
		}
	}()
	phase.Store(-1)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	for i, l := range layers {
		b.ReportMetric(median(halves[i]), l.Name+"-ns")
		if i > 0 {
			b.ReportMetric(median(ratios[i]), l.Name+"/"+layers[0].Name)
		}
	}
	b.ReportMetric(0, "ns/op")
}

// echoRounds runs the echoes of AlternatingRounds: in round r, the layer
// of that round, once phase is r, until phase is -1. It reports on ready
// when its thread is set up (or could not be), and on done when it ends.
func echoRounds(layers []Layer, perRound int, phase *atomic.Int64, thread func(echo bool) (func(), error), ready, done chan<- error) {
	if thread != nil {
		undo, err := thread(true)
		if err != nil {
			ready <- err
			return
		}
		defer undo()
	}
	ready <- nil
	for r := int64(1); ; r++ {
		for ph := phase.Load(); ph != r; ph = phase.Load() {
			if ph < 0 {
				done <- nil
				return
			}
		}
		l := layers[(r-1)%int64(len(layers))]
		for range perRound {
			if err := l.Echo(); err != nil {
				done <- fmt.Errorf("%s echo: %w", l.Name, err)
				return
			}
		}
	}
}
