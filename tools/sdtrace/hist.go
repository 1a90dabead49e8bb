package main

import (
	"fmt"
	"io"
	"math/bits"
	"slices"
	"strings"
	"time"
)

// hist is a log2 histogram of latencies, as bcc's funclatency prints them:
// bucket 0 counts values 0 and 1, bucket i ≥ 1 counts [2^i, 2^(i+1)).
type hist struct {
	counts [64]uint64
	n      uint64
	sum    time.Duration
}

func bucket(v uint64) int { return max(bits.Len64(v)-1, 0) }

func (h *hist) add(d time.Duration, unit time.Duration) {
	h.counts[bucket(uint64(max(d, 0)/unit))]++
	h.n++
	h.sum += d
}

// bucketRange returns the values bucket i counts.
func bucketRange(i int) (lo, hi uint64) {
	if i == 0 {
		return 0, 1
	}
	return 1 << i, 1<<(i+1) - 1
}

// histograms holds one histogram per operation ("nic rdma-write").
type histograms struct {
	unit time.Duration
	m    map[string]*hist
}

func newHistograms(unit time.Duration) *histograms {
	return &histograms{unit: unit, m: map[string]*hist{}}
}

func (hs *histograms) add(op string, d time.Duration) {
	h := hs.m[op]
	if h == nil {
		h = &hist{}
		hs.m[op] = h
	}
	h.add(d, hs.unit)
}

func (hs *histograms) ops() []string {
	ops := make([]string, 0, len(hs.m))
	for op := range hs.m {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	return ops
}

func unitName(u time.Duration) string {
	switch u {
	case time.Nanosecond:
		return "nsecs"
	case time.Millisecond:
		return "msecs"
	}
	return "usecs"
}

// printText prints every histogram like funclatency.
func (hs *histograms) printText(w io.Writer) {
	unit := unitName(hs.unit)
	if len(hs.m) == 0 {
		fmt.Fprintln(w, "no latencies measured")
		return
	}
	for _, op := range hs.ops() {
		h := hs.m[op]
		first, last := -1, 0
		var peak uint64
		for i, c := range h.counts {
			if c > 0 {
				if first < 0 {
					first = i
				}
				last = i
				peak = max(peak, c)
			}
		}
		fmt.Fprintf(w, "\n%s\n%20s : count     distribution\n", op, unit)
		for i := first; i <= last; i++ {
			lo, hi := bucketRange(i)
			stars := int(h.counts[i] * 40 / peak)
			fmt.Fprintf(w, "%10d -> %-10d : %-8d |%-40s|\n", lo, hi, h.counts[i], strings.Repeat("*", stars))
		}
		fmt.Fprintf(w, "avg = %s, total: %d\n", (h.sum / time.Duration(h.n)).String(), h.n)
	}
}

// jsonHist is a histogram in -json output.
type jsonHist struct {
	Kind    string       `json:"kind"` // "histogram"
	Op      string       `json:"op"`
	Unit    string       `json:"unit"`
	Count   uint64       `json:"count"`
	AvgNS   int64        `json:"avg_ns"`
	Buckets []jsonBucket `json:"buckets"`
}

type jsonBucket struct {
	Lo    uint64 `json:"lo"`
	Hi    uint64 `json:"hi"`
	Count uint64 `json:"count"`
}

func (hs *histograms) json() []jsonHist {
	var out []jsonHist
	for _, op := range hs.ops() {
		h := hs.m[op]
		j := jsonHist{Kind: "histogram", Op: op, Unit: unitName(hs.unit), Count: h.n, AvgNS: int64(h.sum) / int64(h.n), Buckets: []jsonBucket{}}
		for i, c := range h.counts {
			if c > 0 {
				lo, hi := bucketRange(i)
				j.Buckets = append(j.Buckets, jsonBucket{lo, hi, c})
			}
		}
		out = append(out, j)
	}
	return out
}
