package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// TestLatRow checks perftest's latency statistics on known samples.
func TestLatRow(t *testing.T) {
	// Posts 2 µs apart, but for two slow gaps (dropped: the tail) and one
	// 4 µs gap: deltas 2×6, 4, 100, 50 (µs).
	deltas := []int64{2, 2, 4, 2, 100, 2, 2, 50, 2}
	posted := []int64{0}
	for _, d := range deltas {
		posted = append(posted, posted[len(posted)-1]+d*1000)
	}
	r := latRow(8, posted, 2)
	// Sorted, halved: 1 1 1 1 1 1 2 | 25 50; cnt = 7.
	want := [7]float64{
		1,                   // t_min
		25,                  // t_max: perftest's delta[cnt], the first dropped
		1,                   // t_typical: median of the first 7
		8.0 / 7,             // t_avg
		math.Sqrt(6.0 / 49), // t_stdev: Σ(x-avg)² = 6·(1/7)² + (6/7)² = 42/49, over 7
		25,                  // 99%: delta[ceil(7·0.99)] = delta[7]
		25,                  // 99.9%
	}
	if r.size != 8 || r.iters != 10 {
		t.Errorf("size %d iters %d", r.size, r.iters)
	}
	for i := range want {
		if math.Abs(r.v[i]-want[i]) > 1e-9 {
			t.Errorf("column %d: %v, want %v", i, r.v[i], want[i])
		}
	}
	// read_lat is not halved.
	if r1 := latRow(8, posted, 1); r1.v[0] != 2 {
		t.Errorf("rtt 1: t_min %v, want 2", r1.v[0])
	}
}

// TestBWRow: a steady stream of one message per µs, 128 in flight.
func TestBWRow(t *testing.T) {
	const n, lat = 1000, 128_000 // ns
	posted := make([]int64, n)
	completed := make([]int64, n)
	for i := range n {
		posted[i] = int64(i) * 1000
		completed[i] = posted[i] + lat
	}
	r := bwRow(1<<20, posted, completed)
	span := float64(completed[n-1]) / 1e9 // s
	if avg := float64(n) / span; math.Abs(r.v[1]-avg) > 1e-6*avg {
		t.Errorf("average %v MB/s, want %v", r.v[1], avg)
	}
	if rate := float64(n) / span / 1e6; math.Abs(r.v[2]-rate) > 1e-9 {
		t.Errorf("msgrate %v, want %v", r.v[2], rate)
	}
	// Best window: posts 0 … 999, (999·1000+128000)/1000 ns per message.
	if peak := 1e9 / float64((999*1000+lat)/1000); math.Abs(r.v[0]-peak) > 1e-6*peak {
		t.Errorf("peak %v MB/s, want %v", r.v[0], peak)
	}
	if r.v[0] < r.v[1] {
		t.Errorf("peak %v below average %v", r.v[0], r.v[1])
	}
}

// TestPrintRow: the rows are perftest's printf formats.
func TestPrintRow(t *testing.T) {
	var b bytes.Buffer
	printRow(&b, &row{kind: rowLat, size: 2, iters: 1000, v: [7]float64{0.95, 5.68, 0.98, 1, 0.13, 1.26, 5.68}})
	printRow(&b, &row{kind: rowBW, size: 65536, iters: 5000, v: [7]float64{11012.51, 11008.64, 0.176138}})
	want := " 2       1000          0.95           5.68         0.98     \t       1.00        \t0.13   \t\t1.26    \t\t5.68   \n" +
		" 65536      5000             11012.51            11008.64\t\t   0.176138\n"
	if b.String() != want {
		t.Errorf("rows\n%q\nwant\n%q", b.String(), want)
	}
	for _, h := range []string{resultFmtLat, resultFmtBW} {
		if !strings.HasPrefix(h, " #bytes") {
			t.Errorf("header %q", h)
		}
	}
}
