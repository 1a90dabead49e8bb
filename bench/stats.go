package main

import (
	"math"
	"slices"
	"time"
)

// Latency is a summary of half round trips in nanoseconds.
type Latency struct {
	Min, P50, P99, P999 float64
	N                   int // samples
}

// summarize turns full round-trip samples (ns) into half round-trip
// percentiles. It sorts rtts in place.
func summarize(rtts []int64) *Latency {
	if len(rtts) == 0 {
		return &Latency{}
	}
	slices.Sort(rtts)
	half := func(q float64) float64 {
		// nearest rank: the smallest sample with at least q of all at or below it
		// (the epsilon keeps 0.99*1000 from rounding up to rank 991)
		i := int(math.Ceil(q*float64(len(rtts))-1e-9)) - 1
		i = max(0, min(i, len(rtts)-1))
		return float64(rtts[i]) / 2
	}
	return &Latency{
		Min:  float64(rtts[0]) / 2,
		P50:  half(0.50),
		P99:  half(0.99),
		P999: half(0.999),
		N:    len(rtts),
	}
}

// throughput returns GB/s and million messages/s for msgs messages of size
// bytes in d.
func throughput(size int, msgs int64, d time.Duration) (gbps, mps float64) {
	if d <= 0 {
		return 0, 0
	}
	s := d.Seconds()
	return float64(size) * float64(msgs) / s / 1e9, float64(msgs) / s / 1e6
}

// sampler collects round-trip times with one clock read per iteration and
// no allocation: every sample is the time between two consecutive calls of
// lap. The clock is the monotonic one (time.Since of a monotonic base reads
// only it).
type sampler struct {
	base    time.Time
	last    time.Duration
	samples []int64
	n       int
	end     time.Duration // stop once a lap ends after this
	stop    int           // or once n reaches this
}

func newSampler(max int) *sampler { return &sampler{samples: make([]int64, max)} }

// start begins a measurement of at most len(samples) laps or about budget.
func (s *sampler) start(budget time.Duration) {
	s.n = 0
	s.resume(budget, len(s.samples))
}

// resume goes on with a measurement for about budget or laps more laps,
// keeping the samples taken so far: a round of a measurement interleaved
// with another.
func (s *sampler) resume(budget time.Duration, laps int) {
	s.stop = min(len(s.samples), s.n+laps)
	s.base = time.Now()
	s.last = time.Since(s.base)
	s.end = s.last + budget
}

// lap records the time since the previous lap and tells whether to go on.
func (s *sampler) lap() bool {
	if s.n >= s.stop {
		return false // a resumed round with no room left takes nothing
	}
	now := time.Since(s.base)
	s.samples[s.n] = int64(now - s.last)
	s.last = now
	s.n++
	return s.n < s.stop && now < s.end
}

// result returns the samples taken.
func (s *sampler) result() []int64 { return s.samples[:s.n] }
