package main

// UCX as a peer: its own benchmark, ucx_perftest (Debian package
// ucx-utils), over shared memory between two processes pinned as ours are.
//
//   - conn suite: ucx/tag (tag_lat, tag_bw: tag-matched messages) and
//     ucx/stream (stream_lat, stream_bw: UCP's byte stream, the closest to
//     a net.Conn), ping-pong and stream at the suite's sizes.
//   - rdma suite: ucx/put (ucp_put_lat, ucp_put_bw) beside our write_lat
//     and write_bw, ucx/get (ucp_get with one get in flight, then with a
//     window) beside read_lat and read_bw.
//
// What ucx_perftest reports, and how it becomes our records:
//
//   - Latency tests of the ping-pong kind (tag_lat, stream_lat,
//     ucp_put_lat) divide the round trip by two (libperf's factor 2): their
//     latency is a half round trip, as ours is. ucp_get has no ping-pong:
//     its latency is the whole get, as our read_lat is the whole read.
//   - The percentile column (-R) is taken over the last 2048 iterations
//     (libperf's timing queue), so every run has more iterations than that.
//     One run gives one percentile: lat_p50 comes from a run with -R 50,
//     lat_p99 from a second with -R 99; lat_min and lat_p999 are not
//     measured.
//   - Bandwidth is in MB/s of 2^20 bytes, turned into GB/s of 1e9 bytes.
//     A bandwidth row is plan.bwChunks runs, its spread their range.
//
// UCX_TLS is ucxDefaultTLS unless the environment sets it. The tool runs
// with the environment's other UCX_* variables too (UCX_LOG_LEVEL, …).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	envUCX = "SANDIRECT_BENCH_UCX" // ucx_perftest's path; "0": leave UCX out

	// ucxDefaultTLS: shared memory (posix: segments in /dev/shm that the
	// peer maps) and loopback to self, without cross-memory attach (cma):
	// its process_vm_readv rendezvous made UCX's 64 KiB and 1 MiB
	// ping-pong 3x slower here (docs/peers.md). The bar is UCX at its best.
	ucxDefaultTLS = "posix,self"

	ucxTimingQueue = 2048 // iterations libperf's percentile looks at
)

// A ucxCase is one case of ours that a ucx_perftest test measures.
type ucxCase struct {
	suite, cas, transport string
	test                  string // -t
	window                int    // -O, outstanding operations; 0: the test's default
	lat                   bool   // a latency test, else bandwidth
}

var ucxCases = []ucxCase{
	{suite: "conn", cas: "pingpong", transport: "ucx/tag", test: "tag_lat", lat: true},
	{suite: "conn", cas: "stream", transport: "ucx/tag", test: "tag_bw"},
	{suite: "conn", cas: "pingpong", transport: "ucx/stream", test: "stream_lat", lat: true},
	{suite: "conn", cas: "stream", transport: "ucx/stream", test: "stream_bw"},
	{suite: "rdma", cas: "write_lat", transport: "ucx/put", test: "ucp_put_lat", lat: true},
	{suite: "rdma", cas: "write_bw", transport: "ucx/put", test: "ucp_put_bw"},         // 32 in flight by default, as ours
	{suite: "rdma", cas: "read_lat", transport: "ucx/get", test: "ucp_get", lat: true}, // one in flight by default
	{suite: "rdma", cas: "read_bw", transport: "ucx/get", test: "ucp_get", window: rdmaWindow},
}

// ucxResult is one line of ucx_perftest's CSV output (-v).
type ucxResult struct {
	Iters       int64
	Rank        float64 // the percentile's rank, 50 for the median
	Percentile  float64 // µs
	Avg         float64 // µs, the last report interval
	Overall     float64 // µs, the whole run
	AvgMBps     float64 // MB/s of 2^20 bytes
	OverallMBps float64
	AvgRate     float64 // messages/s
	OverallRate float64
}

// parseUCXPerftest reads the final result of ucx_perftest -v -f: a header
// naming the percentile ("iterations,50.0_percentile_lat,...") and one line
// of numbers.
func parseUCXPerftest(out string) (ucxResult, error) {
	var r ucxResult
	header := false
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		f := strings.Split(line, ",")
		if len(f) != 8 {
			continue
		}
		if f[0] == "iterations" {
			rank, ok := strings.CutSuffix(f[1], "_percentile_lat")
			v, err := strconv.ParseFloat(rank, 64)
			if !ok || err != nil {
				return r, fmt.Errorf("ucx_perftest: unknown column %q in %q", f[1], line)
			}
			r.Rank, header = v, true
			continue
		}
		if !header || strings.HasPrefix(line, "[") { // "[thread 0]…": a report interval, not the end
			continue
		}
		var v [8]float64
		for i, s := range f {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil || x < 0 || x != x {
				return r, fmt.Errorf("ucx_perftest: bad number %q in %q", s, line)
			}
			v[i] = x
		}
		r.Iters = int64(v[0])
		r.Percentile, r.Avg, r.Overall = v[1], v[2], v[3]
		r.AvgMBps, r.OverallMBps, r.AvgRate, r.OverallRate = v[4], v[5], v[6], v[7]
	}
	switch {
	case !header:
		return r, fmt.Errorf("ucx_perftest: no CSV header in its output: %q", lastLines(out, 3))
	case r.Iters == 0:
		return r, fmt.Errorf("ucx_perftest: no final result in its output: %q", lastLines(out, 3))
	}
	return r, nil
}

// gbps is the run's bandwidth in GB/s (1e9 bytes/s).
func (r ucxResult) gbps() float64 { return r.OverallMBps * (1 << 20) / 1e9 }

// ucxRunner runs ucx_perftest tests; bin is the tool.
type ucxRunner struct {
	bin string
	env *Env
}

// newUCXRunner finds ucx_perftest, or says why UCX is left out.
func newUCXRunner(env *Env) (*ucxRunner, error) {
	bin, err := toolPath(envUCX, "ucx_perftest", "ucx-utils")
	if err != nil {
		return nil, err
	}
	return &ucxRunner{bin: bin, env: env}, nil
}

// tls is the UCX_TLS the runs use.
func ucxTLS() string {
	if v := os.Getenv("UCX_TLS"); v != "" {
		return v
	}
	return ucxDefaultTLS
}

// test runs one ucx_perftest test: args after the test name and size.
func (u *ucxRunner) test(ctx context.Context, test string, size int, args ...string) (ucxResult, error) {
	pair := toolPair{
		bin: u.bin,
		env: []string{"UCX_TLS=" + ucxTLS()},
		server: func(port int) []string {
			return []string{"-p", strconv.Itoa(port)}
		},
		client: func(port int) []string {
			return append([]string{"127.0.0.1", "-p", strconv.Itoa(port), "-t", test, "-s", strconv.Itoa(size), "-v", "-f"}, args...)
		},
	}
	out, err := pair.run(ctx, u.env)
	if err != nil {
		return ucxResult{}, err
	}
	r, err := parseUCXPerftest(out)
	if err != nil {
		return r, fmt.Errorf("%s %d B: %w", test, size, err)
	}
	return r, nil
}

// latIters is how many round trips of size bytes fill budget, at a guess
// of what shared memory does (250 ns plus 8 GB/s each way), within the
// plan's limit but never fewer than the percentile looks at.
func latIters(size int, budget time.Duration, most int) int {
	rtt := 2 * (250*time.Nanosecond + time.Duration(size/8))
	return max(2*ucxTimingQueue, min(most, int(budget/rtt)))
}

// bwIters is how many size-byte messages fill budget at a guess of 40 ns
// plus 12 GB/s each.
func bwIters(size int, budget time.Duration) int {
	per := 40*time.Nanosecond + time.Duration(size/12)
	return max(20, min(50_000_000, int(budget/per)))
}

// latency measures c at size: a run for the median, one for the 99th
// percentile.
func (u *ucxRunner) latency(ctx context.Context, c ucxCase, size int) (*Latency, error) {
	plan := u.env.plan
	n := latIters(size, plan.latTime/2, plan.latMax)
	warm := max(100, min(plan.latWarm, n/10))
	args := []string{"-n", strconv.Itoa(n), "-w", strconv.Itoa(warm)}
	if c.window > 0 {
		args = append(args, "-O", strconv.Itoa(c.window))
	}
	lat := &Latency{N: n}
	for _, rank := range []float64{50, 99} {
		r, err := u.test(ctx, c.test, size, append(args, "-R", strconv.FormatFloat(rank, 'f', -1, 64))...)
		if err != nil {
			return nil, err
		}
		if r.Rank != rank {
			return nil, fmt.Errorf("%s: asked for the %v percentile, got the %v", c.test, rank, r.Rank)
		}
		if rank == 50 {
			lat.P50 = r.Percentile * 1e3
		} else {
			lat.P99 = r.Percentile * 1e3
		}
	}
	return lat, nil
}

// bandwidth measures c at size in plan.bwChunks runs.
func (u *ucxRunner) bandwidth(ctx context.Context, c ucxCase, size int) (bwSpread, error) {
	k := max(1, u.env.plan.bwChunks)
	n := bwIters(size, u.env.plan.bwTime/time.Duration(k))
	args := []string{"-n", strconv.Itoa(n), "-w", strconv.Itoa(max(2, n/10))}
	if c.window > 0 {
		args = append(args, "-O", strconv.Itoa(c.window))
	}
	var gbps []float64
	for range k {
		r, err := u.test(ctx, c.test, size, args...)
		if err != nil {
			return bwSpread{}, err
		}
		gbps = append(gbps, r.gbps())
	}
	return spreadOf(gbps), nil
}

// ucxSizes are the sizes suite measures case cas at, as it does ours.
func ucxSizes(env *Env, suite, cas string) []int {
	var sizes []int
	if suite == "conn" {
		ping, stream := connSizes(env)
		sizes = stream
		if cas == "pingpong" {
			sizes = ping
		}
	} else {
		lat, bw := rdmaSizes(env)
		sizes = bw
		if strings.HasSuffix(cas, "_lat") {
			sizes = lat
		}
	}
	return env.wanted(cas, sizes)
}

// ucxRows is how many rows runUCX reports for suite.
func ucxRows(env *Env, suite string) int {
	n := 0
	for _, c := range ucxCases {
		if c.suite == suite {
			n += len(ucxSizes(env, suite, c.cas))
		}
	}
	return n
}

// runUCX measures every UCX case of the running suite. Without
// ucx_perftest it says why and reports nothing; a failing run is an error
// of that transport, after which the others go on.
func runUCX(ctx context.Context, env *Env) ([]Record, error) {
	var todo []ucxCase
	for _, c := range ucxCases {
		if c.suite == env.suite && peerChosen(env, c.transport) {
			todo = append(todo, c)
		}
	}
	if len(todo) == 0 {
		return nil, nil
	}
	u, err := newUCXRunner(env)
	if err != nil {
		if !errors.Is(err, errToolSkipped) {
			return nil, err
		}
		for _, t := range caseTransports(todo) {
			env.sayOnce(env.suite+" "+t, "%-9s %-18s %s\n", "", t, oneLine(err))
		}
		for range ucxRows(env, env.suite) {
			env.step("ucx skipped")
		}
		return nil, nil
	}
	env.sayOnce(env.suite+" ucx", "%-9s %-18s note: ucx_perftest, UCX_TLS=%s\n", "", "ucx", ucxTLS())
	var recs []Record
	var failed []error
	for _, t := range caseTransports(todo) {
		r, err := u.transport(ctx, todo, t)
		recs = append(recs, r...)
		if err != nil {
			if ctx.Err() != nil {
				return recs, err
			}
			err = fmt.Errorf("%s: %w", t, err)
			fmt.Fprintf(env.out, "%-9s %-18s FAILED: %s\n", "", t, oneLine(err))
			failed = append(failed, err)
		}
	}
	return recs, errors.Join(failed...)
}

// transport measures the cases of transport t among todo.
func (u *ucxRunner) transport(ctx context.Context, todo []ucxCase, t string) (recs []Record, err error) {
	for _, c := range todo {
		if c.transport != t {
			continue
		}
		for _, size := range ucxSizes(u.env, c.suite, c.cas) {
			res := Result{Case: c.cas, Transport: c.transport, Size: size, Preempted: -1, Handoff: u.env.probeHandoff()}
			if c.lat {
				if res.Lat, err = u.latency(ctx, c, size); err != nil {
					return recs, err
				}
			} else {
				bw, err := u.bandwidth(ctx, c, size)
				if err != nil {
					return recs, err
				}
				res.HasBW, res.BW, res.BWMin, res.BWMax = true, bw.P50, bw.Min, bw.Max
				res.Rate = bw.P50 * 1e3 / float64(size)
			}
			recs = append(recs, u.env.Report(res)...)
		}
	}
	return recs, nil
}

// caseTransports lists the transports of cases, in order, once each.
func caseTransports(cases []ucxCase) []string {
	var ts []string
	for _, c := range cases {
		if !slices.Contains(ts, c.transport) {
			ts = append(ts, c.transport)
		}
	}
	return ts
}
