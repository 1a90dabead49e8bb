package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// A Suite is one group of measurements, registered from its own file with
// register. Run measures, prints each row as it goes (Env.Report) and
// returns the records; on error it returns what it measured so far.
type Suite struct {
	Name string // as given on the command line; also Record.Suite
	Doc  string // one line for -h
	Run  func(ctx context.Context, env *Env) ([]Record, error)
	// Rows is how many rows Run will report in env's plan (Env.Report and
	// Env.step calls), for the progress bar; nil: unknown.
	Rows func(env *Env) int
}

var suites []*Suite // in registration order (file name order)

// register adds a suite; call it from init.
func register(s *Suite) {
	if lookupSuite(s.Name) != nil {
		panic("bench: suite " + s.Name + " registered twice")
	}
	suites = append(suites, s)
}

func lookupSuite(name string) *Suite {
	for _, s := range suites {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Record is one number, as written to the JSON file. The field names, the
// metric names and the transport names are read by other tools: keep them
// stable.
type Record struct {
	Suite     string  `json:"suite"`
	Case      string  `json:"case"`
	Transport string  `json:"transport"`
	Size      int     `json:"size"`
	Metric    string  `json:"metric"`
	Value     float64 `json:"value"`
}

// Metric names.
const (
	metricLatMin  = "lat_min_ns"  // half round trip, minimum
	metricLatP50  = "lat_p50_ns"  // half round trip, median
	metricLatP99  = "lat_p99_ns"  // half round trip, 99th percentile
	metricLatP999 = "lat_p999_ns" // half round trip, 99.9th percentile
	metricBW      = "bw_gbps"     // payload bytes per second / 1e9; the median chunk where measured in chunks
	metricBWMin   = "bw_min_gbps" // the slowest chunk (or batch) of a bandwidth measurement
	metricBWMax   = "bw_max_gbps" // the fastest chunk
	metricRate    = "rate_mps"    // messages per second / 1e6, at bw_gbps
	metricMem     = "mem_bytes"   // memory, bytes (conn: per idle connection)
	// The cache-line hand-off between the two measuring CPUs, half a
	// round trip's median, measured just before the row (conn): where the
	// host had put the two vCPUs when the row ran.
	metricHandoff = "handoff_ns"
)

// Result is one row of a table: the latency and/or throughput of one case,
// transport and size.
type Result struct {
	Case      string
	Transport string
	Size      int
	Lat       *Latency // nil: not a latency measurement
	HasBW     bool     // BW and Rate were measured
	BW        float64  // GB/s (1e9 bytes/s); the median when measured in chunks
	BWMin     float64  // the slowest and the fastest chunk; 0: one measurement
	BWMax     float64
	Rate      float64 // million messages/s
	Preempted int64   // involuntary context switches of the measuring threads; set by Report unless < 0 (not counted)
	Handoff   float64 // ns: the cache-line hand-off just before the row (Env.probeHandoff); 0: not measured
}

// Env is what a suite gets: the run's options and its output. It is used by
// one goroutine at a time.
type Env struct {
	ctx      context.Context
	out      io.Writer
	quick    bool
	plan     plan
	cpus     [2]int          // measuring CPU of this process and of the peer; -1: unpinned
	suite    string          // the suite running now
	handoff  func() float64  // measures the cache-line hand-off now (ns); nil: no probe in this suite
	only     *sizeCase       // measure only this case and size (the conn suite's paired rows); nil: all
	said     map[string]bool // notes printed once a run (sayOnce)
	preempts int64           // the most preemptions of measuring threads in one row so far
	progress *progressBar    // nil: none
}

func newEnv(ctx context.Context, out io.Writer, quick, pin bool) (*Env, error) {
	e := &Env{ctx: ctx, out: out, quick: quick, cpus: [2]int{-1, -1}}
	switch {
	case testTiny:
		e.plan = tinyPlan()
	case quick:
		e.plan = quickPlan()
	default:
		e.plan = fullPlan()
	}
	if pin {
		cpus, err := sys.AllowedCPUs()
		if err != nil {
			return nil, fmt.Errorf("read CPU affinity: %w", err)
		}
		if len(cpus) >= 2 {
			e.cpus = [2]int{cpus[0], cpus[1]}
		}
	}
	return e, nil
}

func (e *Env) describe() string {
	mode := "full"
	if e.quick {
		mode = "quick"
	}
	pin := "unpinned"
	if e.cpus[0] >= 0 {
		pin = fmt.Sprintf("pinned to CPUs %d (this) and %d (peer)", e.cpus[0], e.cpus[1])
	}
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		// Other work on the machine shows in every number: say how much.
		if f := strings.Fields(string(b)); len(f) >= 3 {
			load = strings.Join(f[:3], " ")
		}
	}
	return fmt.Sprintf("%s run, %s, load %s, clock read %v, %s", mode, pin, load, clockCost(),
		time.Now().Format(time.RFC3339))
}

// clockCost is the least time between two clock reads as the sampler makes
// them: part of every latency sample, floors included.
func clockCost() time.Duration {
	base := time.Now()
	best := time.Duration(1 << 62)
	last := time.Since(base)
	for range 10000 {
		now := time.Since(base)
		best = min(best, now-last)
		last = now
	}
	return best
}

// Report prints r as a table row and returns its records. The row shows
// how often the measuring threads were preempted since the previous Report.
func (e *Env) Report(r Result) []Record {
	if n := preempted.Swap(0); r.Preempted >= 0 {
		r.Preempted = n
		e.preempts = max(e.preempts, n)
	}
	printRow(e.out, r)
	rec := func(metric string, v float64) Record {
		return Record{Suite: e.suite, Case: r.Case, Transport: r.Transport, Size: r.Size, Metric: metric, Value: v}
	}
	var out []Record
	if r.Lat != nil {
		// A peer's tool may report only some of them (0: not measured).
		for _, m := range []struct {
			name string
			v    float64
		}{{metricLatMin, r.Lat.Min}, {metricLatP50, r.Lat.P50}, {metricLatP99, r.Lat.P99}, {metricLatP999, r.Lat.P999}} {
			if m.v > 0 {
				out = append(out, rec(m.name, m.v))
			}
		}
	}
	if r.Handoff > 0 {
		out = append(out, rec(metricHandoff, r.Handoff))
	}
	if r.HasBW {
		out = append(out, rec(metricBW, r.BW))
		if r.BWMax > 0 {
			out = append(out, rec(metricBWMin, r.BWMin), rec(metricBWMax, r.BWMax))
		}
		out = append(out, rec(metricRate, r.Rate))
	}
	e.step(r.Case + " " + r.Transport + " " + fsize(r.Size))
	return out
}

// A sizeCase is one case of a suite at one size.
type sizeCase struct {
	cas  string
	size int
}

// wanted returns the sizes of case cas that the suite measures now: all
// of them, or Env.only's.
func (e *Env) wanted(cas string, sizes []int) []int {
	if e.only == nil {
		return sizes
	}
	return slices.DeleteFunc(slices.Clone(sizes), func(n int) bool { return e.only.cas != cas || e.only.size != n })
}

// sayOnce prints a note line the first time key comes, and never again in
// the run: a peer's note, before its first row.
func (e *Env) sayOnce(key, format string, args ...any) {
	if e.said[key] {
		return
	}
	if e.said == nil {
		e.said = map[string]bool{}
	}
	e.said[key] = true
	fmt.Fprintf(e.out, format, args...)
}

// probeHandoff measures the cache-line hand-off between the measuring
// CPUs now, for the row about to be measured (Result.Handoff): the host
// moves the two vCPUs near and far apart from one minute to the next,
// and a row's latency and bandwidth move with it, so that a ratio of two
// rows means something only where their hand-offs agree. 0 where the
// suite has no probe.
func (e *Env) probeHandoff() float64 {
	if e.handoff == nil {
		return 0
	}
	return e.handoff()
}

// step advances the progress bar by one row; label says what was measured.
func (e *Env) step(label string) {
	if e.progress != nil {
		e.progress.step(e.suite, label)
	}
}

// plan is how long and over which sizes the suites measure.
type plan struct {
	latWarm   int           // busy-poll round trips before measuring
	latMax    int           // at most this many measured busy-poll round trips
	latTime   time.Duration // per size, busy-poll
	blockWarm int           // the same for sleeping (futex) round trips
	blockMax  int
	blockTime time.Duration
	bwTime    time.Duration // per size, throughput
	bwChunks  int           // conn streaming: chunks per size (the spread)

	pingSizes   []int // ring ping-pong, busy
	blockSizes  []int // ring ping-pong, block
	streamSizes []int // ring streaming
	copySizes   []int // memcpy
	pipeSizes   []int // floor's two-core pipeline

	connPingSizes   []int // conn ping-pong, every transport
	connStreamSizes []int // conn streaming
}

// testTiny shrinks every run to a few milliseconds; set by tests only.
var testTiny bool

func pow2Sizes(from, to, step int) []int {
	var s []int
	for n := from; n <= to; n *= step {
		s = append(s, n)
	}
	return s
}

const (
	kiB = 1 << 10
	miB = 1 << 20
)

func fullPlan() plan {
	return plan{
		latWarm: 20000, latMax: 2_000_000, latTime: time.Second,
		blockWarm: 500, blockMax: 200_000, blockTime: 2 * time.Second,
		bwTime:      time.Second,
		pingSizes:   pow2Sizes(8, 64*kiB, 2),
		blockSizes:  pow2Sizes(8, 64*kiB, 2),
		streamSizes: pow2Sizes(64, miB, 4),
		copySizes:   pow2Sizes(4*kiB, 256*miB, 4),
		pipeSizes:   []int{64 * kiB, miB, 4 * miB, 16 * miB},
		bwChunks:    5,

		connPingSizes:   []int{8, 64, 512, 4 * kiB, 16 * kiB, 64 * kiB, 256 * kiB, miB, 4 * miB, 16 * miB},
		connStreamSizes: []int{8, 64, 512, 4 * kiB, 16 * kiB, 64 * kiB, 256 * kiB, miB, 4 * miB, 16 * miB},
	}
}

func quickPlan() plan {
	return plan{
		latWarm: 5000, latMax: 500_000, latTime: 200 * time.Millisecond,
		blockWarm: 100, blockMax: 50_000, blockTime: 400 * time.Millisecond,
		bwTime:      200 * time.Millisecond,
		pingSizes:   []int{8, 64, 512, 4 * kiB, 64 * kiB},
		blockSizes:  []int{8, 4 * kiB, 64 * kiB},
		streamSizes: []int{64, kiB, 16 * kiB, 64 * kiB, miB},
		copySizes:   []int{4 * kiB, 64 * kiB, miB, 16 * miB, 256 * miB},
		pipeSizes:   []int{64 * kiB, miB, 16 * miB},
		bwChunks:    3,

		connPingSizes:   []int{8, 64, 4 * kiB, 64 * kiB, miB},
		connStreamSizes: []int{64, 4 * kiB, 64 * kiB, miB, 16 * miB},
	}
}

func tinyPlan() plan {
	return plan{
		latWarm: 50, latMax: 2000, latTime: 5 * time.Millisecond,
		blockWarm: 5, blockMax: 200, blockTime: 5 * time.Millisecond,
		bwTime:      5 * time.Millisecond,
		pingSizes:   []int{8, 4 * kiB},
		blockSizes:  []int{8},
		streamSizes: []int{64, 64 * kiB},
		copySizes:   []int{4 * kiB, 64 * kiB},
		pipeSizes:   []int{64 * kiB},
		bwChunks:    2,

		connPingSizes:   []int{8, 64 * kiB},
		connStreamSizes: []int{64, 64 * kiB},
	}
}
