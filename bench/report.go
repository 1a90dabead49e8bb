package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

const rowFormat = "%-9s %-18s %6s %9s %9s %9s %9s %9s %13s %9s %8s %8s\n"

func printSuiteHeader(w io.Writer, suite string) {
	fmt.Fprintf(w, "\n--- %s %s\n", suite, strings.Repeat("-", 80-len(suite)))
	fmt.Fprintf(w, rowFormat, "case", "transport", "size", "min", "p50", "p99", "p99.9", "GB/s", "(range)", "Mmsg/s", "preempt", "handoff")
	fmt.Fprintf(w, rowFormat, "", "", "", "(ns, half", "round", "trip)", "", "", "", "", "", "(ns)")
}

func printRow(w io.Writer, r Result) {
	cols := []string{"-", "-", "-", "-", "-", "-", "-"}
	if r.Lat != nil {
		for i, v := range []float64{r.Lat.Min, r.Lat.P50, r.Lat.P99, r.Lat.P999} {
			if v > 0 { // else not measured (a peer's tool)
				cols[i] = fnum(v)
			}
		}
	}
	if r.HasBW {
		cols[4], cols[6] = fnum(r.BW), fnum(r.Rate)
		if r.BWMax > 0 {
			cols[5] = fnum(r.BWMin) + "-" + fnum(r.BWMax)
		}
	}
	pre := fmt.Sprint(r.Preempted)
	if r.Preempted < 0 {
		pre = "-" // not counted
	}
	hand := "-"
	if r.Handoff > 0 {
		hand = fnum(r.Handoff)
	}
	fmt.Fprintf(w, rowFormat, r.Case, r.Transport, fsize(r.Size), cols[0], cols[1], cols[2], cols[3], cols[4], cols[5],
		cols[6], pre, hand)
}

// fnum prints with three significant digits or more, never in exponent form.
func fnum(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.1f", v)
	case v >= 10:
		return fmt.Sprintf("%.2f", v)
	case v >= 1 || v <= 0:
		return fmt.Sprintf("%.3f", v)
	default: // three significant digits
		return fmt.Sprintf("%.*f", 2-int(math.Floor(math.Log10(v))), v)
	}
}

// flimit prints a target's limit: 0.05, 1.1, 3, 256.
func flimit(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func fsize(n int) string {
	switch {
	case n >= miB && n%miB == 0:
		return fmt.Sprintf("%dMiB", n/miB)
	case n >= kiB && n%kiB == 0:
		return fmt.Sprintf("%dKiB", n/kiB)
	}
	return fmt.Sprintf("%dB", n)
}

// A target is a ratio between two numbers of one run. The first three are
// the founding issue's; a suite may append its own from init.
type target struct {
	name     string
	num, den recordKey
	limit    float64
	atMost   bool // ratio ≤ limit passes; else ratio ≥ limit
	// ceiling, if set, is the machine's best for num at that moment (a
	// cross-core stream cannot beat the two-core pipeline): a miss shows
	// ceiling/den beside it, so a reader sees when no design could pass.
	ceiling *recordKey
}

// A peerTarget is a ratio whose denominator is the best of several peers
// measured in the same run: the least latency (atMost) or the most
// bandwidth. The line names the peer that was best.
type peerTarget struct {
	name   string
	num    recordKey
	peers  []recordKey
	limit  float64
	atMost bool
}

// peerTargets are printed after the targets; suites append theirs from
// init.
var peerTargets []peerTarget

// best returns the best of t's peers that were measured, by find.
func (t peerTarget) best(find func(recordKey) (float64, bool)) (recordKey, float64, bool) {
	var best recordKey
	var v float64
	ok := false
	for _, k := range t.peers {
		x, found := find(k)
		if !found || !(x > 0) {
			continue
		}
		if !ok || (t.atMost && x < v) || (!t.atMost && x > v) {
			best, v, ok = k, x, true
		}
	}
	return best, v, ok
}

// A goal is a limit on one number of a run, in unit (bytes per KiB …).
type goal struct {
	name   string
	key    recordKey
	unit   float64
	limit  float64
	atMost bool
	minus  *recordKey // if set, the goal is on key's number less this one's
}

// goals are printed with the targets; suites append theirs from init.
var goals []goal

type recordKey struct {
	suite, cas, transport string
	size                  int
	metric                string
}

var targets = []target{
	// Both references are measured in the ring suite, in rounds
	// alternating with the ring's (the vCPUs' placement moves them
	// severalfold between suites).
	{"busy ring 8B p50 / cache-line p50 (interleaved)",
		recordKey{"ring", "pingpong", "ring/busy", 8, metricLatP50},
		recordKey{"ring", "pingpong", "cacheline", 8, metricLatP50}, 2.0, true, nil},
	// A ring that sleeps parks its goroutine in the netpoller (the wake
	// hub), so that a waiting goroutine holds no thread: its floor is the
	// netpoller pair's round trip. The futex pair, which blocks a thread
	// at each end, keeps its row in the ring table.
	{"block ring 8B p50 / netpoll p50 (interleaved)",
		recordKey{"ring", "pingpong", "ring/block", 8, metricLatP50},
		recordKey{"ring", "pingpong", "netpoll", 1, metricLatP50}, 1.2, true, nil},
	// copy() at 64 KiB runs in one core's caches; a stream moves every
	// line to the other core, and the two-core pipeline of the same
	// message size is what any stream could reach then.
	{"ring stream 64KiB GB/s / memcpy 64KiB GB/s",
		recordKey{"ring", "stream", "ring/busy", 64 * kiB, metricBW},
		recordKey{"floor", "copy", "memcpy", 64 * kiB, metricBW}, 0.6, false,
		&recordKey{"floor", "stream", "pipeline/best", 64 * kiB, metricBW}},
}

// printTargets prints every target whose two numbers were measured, and a
// warning if the measuring threads of some row were preempted (other load
// on the machine) more than busy-polling tolerates.
func printTargets(w io.Writer, recs []Record, maxPreempts int64) {
	find := func(k recordKey) (float64, bool) {
		for _, r := range recs {
			if r.Suite == k.suite && r.Case == k.cas && r.Transport == k.transport && r.Size == k.size && r.Metric == k.metric {
				return r.Value, true
			}
		}
		return 0, false
	}
	header := false
	line := func(name, num, den string, value, limit float64, atMost bool, note string) {
		if !header {
			fmt.Fprintf(w, "\n--- targets %s\n", strings.Repeat("-", 73))
			fmt.Fprintf(w, "%-46s %9s %9s %9s %7s  %s\n", "ratio", "num", "den", "value", "target", "")
			header = true
		}
		verdict, op := "MISS", ">="
		if atMost {
			op = "<="
		}
		if (atMost && value <= limit) || (!atMost && value >= limit) {
			verdict = "PASS"
		}
		fmt.Fprintf(w, "%-46s %9s %9s %9.2f %3s%s  %s%s\n", name, num, den, value, op, flimit(limit), verdict, note)
	}
	for _, t := range targets {
		num, ok1 := find(t.num)
		den, ok2 := find(t.den)
		if !ok1 || !ok2 || den == 0 {
			continue
		}
		note := ""
		met := (t.atMost && num/den <= t.limit) || (!t.atMost && num/den >= t.limit)
		if t.ceiling != nil && !met {
			if c, ok := find(*t.ceiling); ok {
				note = fmt.Sprintf("  (machine ceiling now %.2f: %s)", c/den, t.ceiling.transport)
			}
		}
		line(t.name, fnum(num), fnum(den), num/den, t.limit, t.atMost, note+handoffNote(find, t.num, t.den))
	}
	for _, t := range peerTargets {
		num, ok1 := find(t.num)
		k, den, ok2 := t.best(find)
		if ok1 && ok2 {
			line(fmt.Sprintf("%s / %s (best)", t.name, k.transport), fnum(num), fnum(den), num/den, t.limit, t.atMost,
				handoffNote(find, t.num, k))
		}
	}
	for _, g := range goals {
		v, ok := find(g.key)
		if !ok {
			continue
		}
		if g.minus == nil {
			line(g.name, fnum(v/g.unit), "", v/g.unit, g.limit, g.atMost, "")
		} else if m, ok := find(*g.minus); ok {
			line(g.name, fnum(v/g.unit), fnum(m/g.unit), (v-m)/g.unit, g.limit, g.atMost, "")
		}
	}
	if header && maxPreempts > busyPreemptions {
		fmt.Fprintf(w, "warning: the measuring threads of one row were preempted %d times (see the preempt column):\n"+
			"other work competes for the CPUs; busy-poll numbers and these ratios are not representative\n", maxPreempts)
	}
}

// handoffApart is how far the cache-line hand-offs before two rows may
// differ, as a ratio, before their ratio is flagged: the host moved the
// vCPUs between them.
const handoffApart = 1.5

// handoffNote says, when the hand-offs measured before rows a and b differ
// by more than handoffApart, that their ratio compares two placements of
// the vCPUs; "" otherwise, or when either was not measured.
func handoffNote(find func(recordKey) (float64, bool), a, b recordKey) string {
	a.metric, b.metric = metricHandoff, metricHandoff
	ha, ok1 := find(a)
	hb, ok2 := find(b)
	if !ok1 || !ok2 || ha <= 0 || hb <= 0 || max(ha, hb)/min(ha, hb) <= handoffApart {
		return ""
	}
	return fmt.Sprintf("  (hand-off %s ns at ours, %s at theirs: the vCPUs moved between the rows)", fnum(ha), fnum(hb))
}

// busyPreemptions is how many preemptions of the measuring threads one row
// may see before printTargets warns. With both CPUs of a 2-CPU machine
// spinning, every wake-up of any other thread (the Go runtime's own
// included) preempts one of them: a few hundred per row on an otherwise idle
// machine; a busy one shows thousands.
const busyPreemptions = 1000

func writeJSON(path string, recs []Record) error {
	// One record a line: readable, diffable, still one JSON array.
	var b bytes.Buffer
	b.WriteString("[")
	for i, r := range recs {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n  ")
		b.Write(line)
	}
	b.WriteString("\n]\n")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// printSideBySide prints the conn suite's headline numbers, one row per
// transport, our transport first, and the floors under them: half round
// trips (median and p99) of small, medium and large messages, streaming
// bandwidth (median chunk and the range). Nothing without conn records.
// printSetupSideBySide prints the setup suite's dial+echo+close beside
// its baselines, and the first dial and accept rates.
func printSetupSideBySide(w io.Writer, recs []Record) {
	get := func(cas, transport string, size int, metric string) (float64, bool) {
		for _, r := range recs {
			if r.Suite == "setup" && r.Case == cas && r.Transport == transport && r.Size == size && r.Metric == metric {
				return r.Value, true
			}
		}
		return 0, false
	}
	if _, ok := get("dial", "sockets/default", 64, metricLatP50); !ok {
		return
	}
	// The suite's latencies are whole durations, stored as half of twice.
	us := func(ns float64) string { return f3(ns / 1e3) }
	fmt.Fprintf(w, "\n--- side by side: setup %s\n", strings.Repeat("-", 61))
	fmt.Fprintf(w, "%-34s%-22s\n", "dial+echo+close 64 B", "µs p50 (p99)")
	for _, r := range []struct{ cas, transport, name string }{
		{"dial", "sockets/default", "sockets (sandirect)"}, {"dial", "unix", "unix"}, {"dial", "tcp", "tcp (net.Dial)"},
		{"fallback", "sockets/fallback", "sockets.Dial(\"tcp\"), not ours"}, {"firstdial", "sockets/default", "first dial, fresh process"},
	} {
		size := 64
		if r.cas == "firstdial" {
			size = 0
		}
		p50, ok1 := get(r.cas, r.transport, size, metricLatP50)
		p99, ok2 := get(r.cas, r.transport, size, metricLatP99)
		if ok1 && ok2 {
			fmt.Fprintf(w, "%-34s%-22s\n", r.name, us(p50)+" ("+us(p99)+")")
		}
	}
	for _, g := range []string{"sockets/1", "sockets/16"} {
		if rate, ok := get("accept", g, 64, metricRate); ok {
			fmt.Fprintf(w, "%-34s%.0f connections/s\n", "accepts, "+strings.TrimPrefix(g, "sockets/")+" dialing goroutines", rate*1e6)
		}
	}
}

func printSideBySide(w io.Writer, recs []Record) {
	get := func(suite, cas, transport string, size int, metric string) (float64, bool) {
		for _, r := range recs {
			if r.Suite == suite && r.Case == cas && r.Transport == transport && r.Size == size && r.Metric == metric {
				return r.Value, true
			}
		}
		return 0, false
	}
	var transports []string
	for _, r := range recs {
		if r.Suite == "conn" && r.Case != "idle" && !isReference(r.Transport) && !slices.Contains(transports, r.Transport) {
			transports = append(transports, r.Transport)
		}
	}
	if len(transports) == 0 {
		return
	}
	// Ours first, then the others in the order they ran.
	slices.SortStableFunc(transports, func(a, b string) int {
		oa, ob := strings.HasPrefix(a, "sockets/"), strings.HasPrefix(b, "sockets/")
		switch {
		case oa && !ob:
			return -1
		case ob && !oa:
			return 1
		}
		return 0
	})
	latSizes := []int{64, 4 * kiB, miB}
	bwSizes := []int{64 * kiB, miB, 16 * miB}
	const cell = "%-20s"
	fmt.Fprintf(w, "\n--- side by side: conn %s\n", strings.Repeat("-", 62))
	fmt.Fprintf(w, "%-20s", "")
	for _, s := range latSizes {
		fmt.Fprintf(w, cell, fsize(s)+" half RTT")
	}
	for _, s := range bwSizes {
		fmt.Fprintf(w, cell, fsize(s)+" stream")
	}
	fmt.Fprintf(w, "\n%-20s", "transport")
	for range latSizes {
		fmt.Fprintf(w, cell, "µs p50 (p99)")
	}
	for range bwSizes {
		fmt.Fprintf(w, cell, "GB/s (range)")
	}
	fmt.Fprintln(w)
	us := func(ns float64) string { return f3(ns / 1e3) }
	for _, t := range transports {
		fmt.Fprintf(w, "%-20s", t)
		for _, s := range latSizes {
			p50, ok1 := get("conn", "pingpong", t, s, metricLatP50)
			p99, ok2 := get("conn", "pingpong", t, s, metricLatP99)
			c := "-"
			if ok1 {
				c = us(p50) + " (-)" // a peer's tool without a p99
				if ok2 {
					c = us(p50) + " (" + us(p99) + ")"
				}
			}
			fmt.Fprintf(w, cell, c)
		}
		for _, s := range bwSizes {
			bw, ok := get("conn", "stream", t, s, metricBW)
			lo, ok1 := get("conn", "stream", t, s, metricBWMin)
			hi, ok2 := get("conn", "stream", t, s, metricBWMax)
			c := "-"
			if ok {
				c = f3(bw)
				if ok1 && ok2 {
					c += " (" + f3(lo) + "-" + f3(hi) + ")"
				}
			}
			fmt.Fprintf(w, cell, c)
		}
		fmt.Fprintln(w)
	}
	var floors []string
	for _, f := range []struct{ transport, name string }{
		{"cacheline", "cache-line hand-off"}, {"futex", "futex wake-up pinned"}, {"futex/unpinned", "unpinned"},
		{"futexcond/unpinned", "waking only sleepers, unpinned"},
	} {
		for _, k := range []string{f.transport} {
			size := 8
			if k != "cacheline" {
				size = 4
			}
			p50, ok1 := get("floor", "pingpong", k, size, metricLatP50)
			p99, ok2 := get("floor", "pingpong", k, size, metricLatP99)
			if ok1 && ok2 {
				floors = append(floors, fmt.Sprintf("%s %s (%s) µs", f.name, us(p50), us(p99)))
			}
		}
	}
	for _, s := range bwSizes {
		if bw, ok := get("floor", "copy", "memcpy", s, metricBW); ok {
			floors = append(floors, fmt.Sprintf("copy() %s %s GB/s", fsize(s), f3(bw)))
		}
		if bw, ok := get("floor", "stream", "pipeline/best", s, metricBW); ok {
			floors = append(floors, fmt.Sprintf("two-core pipeline %s %s GB/s", fsize(s), f3(bw)))
		}
		if bw, ok := get("rdma", "read_bw", "cma/raw", s, metricBW); ok {
			floors = append(floors, fmt.Sprintf("process_vm_readv %s %s GB/s", fsize(s), f3(bw)))
		}
	}
	if len(floors) > 0 {
		fmt.Fprintf(w, "floors: %s\n", strings.Join(floors, "; "))
	}
	if v, ok := get("conn", "idle", connIdleTransport, 0, metricMem); ok {
		fmt.Fprintf(w, "memory per idle connection of ours: %s KiB (both ends)\n", f3(v/kiB))
	}
}

// f3 prints three significant digits (at least the integer part).
func f3(v float64) string {
	if v >= 100 || v <= 0 {
		return fmt.Sprintf("%.0f", v)
	}
	return strconv.FormatFloat(v, 'f', 2-int(math.Floor(math.Log10(v))), 64)
}
