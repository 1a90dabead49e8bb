package main

import (
	"math"
	"slices"
)

// testKind names one of perftest's six tests.
type testKind uint8

const (
	sendLat testKind = iota + 1
	writeLat
	readLat
	sendBW
	writeBW
	readBW
)

var testNames = [...]string{sendLat: "send_lat", writeLat: "write_lat", readLat: "read_lat", sendBW: "send_bw", writeBW: "write_bw", readBW: "read_bw"}

func (k testKind) String() string {
	if k >= sendLat && k <= readBW {
		return testNames[k]
	}
	return "test?"
}

func parseTest(s string) (testKind, bool) {
	for k := sendLat; k <= readBW; k++ {
		if testNames[k] == s {
			return k, true
		}
	}
	return 0, false
}

func (k testKind) lat() bool   { return k <= readLat }
func (k testKind) send() bool  { return k == sendLat || k == sendBW }
func (k testKind) read() bool  { return k == readLat || k == readBW }
func (k testKind) write() bool { return k == writeLat || k == writeBW }

// title is perftest's banner: "Send Latency Test", "RDMA_Write BW Test".
func (k testKind) title() string {
	verb := "Send"
	switch {
	case k.write():
		verb = "RDMA_Write"
	case k.read():
		verb = "RDMA_Read"
	}
	if k.lat() {
		return verb + " Latency Test"
	}
	return verb + " BW Test"
}

// Perftest's defaults (perftest_parameters.h).
const (
	defSizeLat  = 2     // DEF_SIZE_LAT
	defSizeBW   = 65536 // DEF_SIZE_BW
	defItersLat = 1000  // DEF_ITERS
	defItersBW  = 5000  // DEF_ITERS_WB
	txDepthBW   = 128   // DEF_TX_BW
	rxDepthSend = 512   // DEF_RX_SEND
	rxDepthRDMA = 16    // control messages only
	cqMod       = 100   // DEF_CQ_MOD
	latTail     = 2     // LAT_MEASURE_TAIL: the slowest samples dropped
	minItersLat = latTail + 3
	mebi        = 1 << 20 // perftest's MB
)

// allSizes is -a: 2^1 … 2^23, as perftest.
func allSizes() []int {
	s := make([]int, 0, maxSizes)
	for i := 1; i <= maxSizes; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// latRow computes perftest's latency row from the post timestamps (ns) of
// one run: deltas between consecutive posts, divided by rtt (2 for the
// ping-pong tests, 1 for read_lat), in microseconds.
func latRow(size int, posted []int64, rtt int) row {
	n := len(posted) - 1
	d := make([]float64, n)
	q := 1000 * float64(rtt)
	for i := range d {
		d[i] = float64(posted[i+1]-posted[i]) / q
	}
	slices.Sort(d)
	cnt := n - latTail
	// get_median: the middle of the first cnt, as perftest writes it.
	var median float64
	if (cnt-1)%2 != 0 {
		median = (d[cnt/2] + d[cnt/2-1]) / 2
	} else {
		median = d[cnt/2]
	}
	var sum float64
	for _, x := range d[:cnt] {
		sum += x
	}
	avg := sum / float64(cnt)
	var vsum float64
	for _, x := range d[:cnt] {
		vsum += (x - avg) * (x - avg)
	}
	at := func(p float64) float64 {
		return d[min(int(math.Ceil(float64(cnt)*p)), n-1)]
	}
	return row{kind: rowLat, size: size, iters: len(posted), v: [7]float64{
		d[0], d[cnt], median, avg, math.Sqrt(vsum / float64(cnt)), at(0.99), at(0.999),
	}}
}

// bwRow computes perftest's bandwidth row (print_report_bw) from the post
// and completion timestamps (ns) of every operation: the average over the
// whole run, and the peak over windows from any post to a completion at a
// CQ-moderation boundary or the last one.
func bwRow(size int, posted, completed []int64) row {
	n := len(posted)
	best := completed[0] - posted[0]
	for i := range n {
		for j := (i+1+cqMod-1)/cqMod*cqMod - 1; j < n; j += cqMod {
			best = min(best, (completed[j]-posted[i])/int64(j-i+1))
		}
		if n%cqMod != 0 {
			j := n - 1
			best = min(best, (completed[j]-posted[i])/int64(j-i+1))
		}
	}
	return rates(size, n, completed[n-1]-posted[0], best)
}

// recvRow is the receiver's side of send_bw, as perftest's server measures
// it: n messages over the span from the first receive completion to the
// last. The peak is not measured on the receiving side (perftest: "BW peak
// won't be measured in this run"; receives complete in bursts, so windows
// between them mean nothing) and shows as 0.
func recvRow(size int, received []int64) row {
	n := len(received)
	if n < 2 {
		return row{kind: rowBW, size: size, iters: n} // one arrival is no rate
	}
	r := rates(size, n, received[n-1]-received[0], 1)
	r.v[0] = 0
	return r
}

// rates turns a run of n messages over span ns, and the best time per
// message, into peak MB/s, average MB/s and Mpps.
func rates(size, n int, span, best int64) row {
	span, best = max(span, 1), max(best, 1)
	return row{kind: rowBW, size: size, iters: n, v: [7]float64{
		float64(size) * 1e9 / float64(best) / mebi,
		float64(size) * float64(n) * 1e9 / float64(span) / mebi,
		float64(n) * 1e9 / float64(span) / 1e6,
	}}
}
