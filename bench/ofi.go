package main

// libfabric as a peer: its ping-pong, fi_pingpong (Debian package
// libfabric-bin), with the shm provider on reliable datagram endpoints
// (-p shm -e rdm), two processes pinned as ours are: transport ofi/shm of
// the conn suite. FI_SHM_DISABLE_CMA is ofiDisableCMA unless the
// environment sets it.
//
// fi_pingpong (libfabric 1.17) measures ping-pong only, and prints one
// line per size: usec/xfer is the run's time divided by twice its
// iterations, the mean half round trip. It has no percentiles and no
// bandwidth mode. So ofi/shm has no stream rows, and its lat_p50 is the
// median over plan.bwChunks runs of each run's mean (for a distribution
// with a tail to the right, as round trips have, at or above its median);
// its other latency metrics are not measured. It has no warm-up either:
// each run is long enough for its first round trips not to count.

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

const envOFI = "SANDIRECT_BENCH_OFI" // fi_pingpong's path; "0": leave libfabric out

// ofiDisableCMA is the shm provider's FI_SHM_DISABLE_CMA unless the
// environment sets it: without cross-memory attach (process_vm_readv) its
// 64 KiB and 1 MiB ping-pong ran 2-3x faster here, copying through its
// shared buffers instead (docs/peers.md). The bar is libfabric at its best.
const ofiDisableCMA = "1"

func ofiEnv() []string {
	if v, ok := os.LookupEnv("FI_SHM_DISABLE_CMA"); ok {
		return []string{"FI_SHM_DISABLE_CMA=" + v}
	}
	return []string{"FI_SHM_DISABLE_CMA=" + ofiDisableCMA}
}

const ofiTransport = "ofi/shm"

// ofiResult is fi_pingpong's result line for one size.
type ofiResult struct {
	Size    int
	Iters   int64   // round trips
	MBps    float64 // MB/s of 1e6 bytes: both directions' bytes over the run's time
	UsecPer float64 // µs per transfer: a half round trip
}

// parseFiPingpong reads fi_pingpong's table: a header
// "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec" and a line per
// size, "8  100k  =100k  1.5m  0.91s  1.77  4.53  0.22". Counts and sizes
// carry suffixes (k, m, g); "=" says every message was acknowledged.
func parseFiPingpong(out string) ([]ofiResult, error) {
	var rs []ofiResult
	header := false
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 8 && f[0] == "bytes" && f[6] == "usec/xfer" {
			header = true
			continue
		}
		if !header || len(f) != 8 {
			continue
		}
		size, err1 := parseSuffixed(f[0], 1024)
		iters, err2 := parseSuffixed(f[1], 1000)
		mbps, err3 := strconv.ParseFloat(f[5], 64)
		usec, err4 := strconv.ParseFloat(f[6], 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("fi_pingpong: bad result line %q: %w", strings.TrimSpace(line), err)
		}
		if !strings.HasPrefix(f[2], "=") {
			return nil, fmt.Errorf("fi_pingpong: not every message acknowledged: %q", strings.TrimSpace(line))
		}
		if !(usec > 0) || iters <= 0 {
			return nil, fmt.Errorf("fi_pingpong: empty result line %q", strings.TrimSpace(line))
		}
		rs = append(rs, ofiResult{Size: int(size), Iters: iters, MBps: mbps, UsecPer: usec})
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("fi_pingpong: no result in its output: %q", lastLines(out, 3))
	}
	return rs, nil
}

// parseSuffixed parses fi_pingpong's counts: 8, 100k, 1.5m, 3.9g, in
// powers of unit (1024 for sizes, 1000 for counts).
func parseSuffixed(s string, unit float64) (int64, error) {
	mult := 1.0
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k':
			mult, s = unit, s[:n-1]
		case 'm':
			mult, s = unit*unit, s[:n-1]
		case 'g':
			mult, s = unit*unit*unit, s[:n-1]
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad count %q", s)
	}
	return int64(v * mult), nil
}

// ofiRunner runs fi_pingpong; bin is the tool.
type ofiRunner struct {
	bin string
	env *Env
}

// pingpong runs one fi_pingpong of iters round trips of size bytes and
// returns the mean half round trip in ns.
func (o *ofiRunner) pingpong(ctx context.Context, size, iters int) (float64, error) {
	common := []string{"-p", "shm", "-e", "rdm", "-S", strconv.Itoa(size), "-I", strconv.Itoa(iters)}
	pair := toolPair{
		bin: o.bin,
		env: ofiEnv(),
		server: func(port int) []string {
			return append([]string{"-B", strconv.Itoa(port)}, common...)
		},
		client: func(port int) []string {
			return append([]string{"-P", strconv.Itoa(port)}, append(common, "127.0.0.1")...)
		},
	}
	out, err := pair.run(ctx, o.env)
	if err != nil {
		return 0, err
	}
	rs, err := parseFiPingpong(out)
	if err != nil {
		return 0, err
	}
	if len(rs) != 1 || rs[0].Size != size {
		return 0, fmt.Errorf("fi_pingpong -S %d: results for %v", size, rs)
	}
	return rs[0].UsecPer * 1e3, nil
}

// ofiRows is how many rows runOFI reports.
func ofiRows(env *Env) int {
	return len(ofiSizes(env))
}

// ofiSizes are the conn suite's ping-pong sizes that it measures now.
func ofiSizes(env *Env) []int {
	ping, _ := connSizes(env)
	return env.wanted("pingpong", ping)
}

// runOFI measures ofi/shm's ping-pong at the conn suite's sizes. Without
// fi_pingpong it says why and reports nothing.
func runOFI(ctx context.Context, env *Env) ([]Record, error) {
	if !peerChosen(env, ofiTransport) {
		return nil, nil
	}
	bin, err := toolPath(envOFI, "fi_pingpong", "libfabric-bin")
	if err != nil {
		if !errors.Is(err, errToolSkipped) {
			return nil, err
		}
		env.sayOnce("ofi", "%-9s %-18s %s\n", "", ofiTransport, oneLine(err))
		for range ofiRows(env) {
			env.step("ofi skipped")
		}
		return nil, nil
	}
	ping := ofiSizes(env)
	if len(ping) == 0 {
		return nil, nil
	}
	env.sayOnce("ofi", "%-9s %-18s note: fi_pingpong -p shm -e rdm, %s: mean half round trips (median of %d runs); no stream mode\n",
		"", ofiTransport, strings.Join(ofiEnv(), " "), max(1, env.plan.bwChunks))
	o := &ofiRunner{bin: bin, env: env}
	var recs []Record
	for _, size := range ping {
		hand := env.probeHandoff()
		lat, err := o.latency(ctx, size)
		if err != nil {
			err = fmt.Errorf("%s: pingpong %s: %w", ofiTransport, fsize(size), err)
			fmt.Fprintf(env.out, "%-9s %-18s FAILED: %s\n", "", ofiTransport, oneLine(err))
			return recs, err
		}
		recs = append(recs, env.Report(Result{Case: "pingpong", Transport: ofiTransport, Size: size, Lat: lat, Preempted: -1, Handoff: hand})...)
	}
	return recs, nil
}

// latency is the median of plan.bwChunks runs' mean half round trips.
func (o *ofiRunner) latency(ctx context.Context, size int) (*Latency, error) {
	k := max(1, o.env.plan.bwChunks)
	n := latIters(size, o.env.plan.latTime/time.Duration(k), o.env.plan.latMax)
	var means []float64
	for range k {
		m, err := o.pingpong(ctx, size, n)
		if err != nil {
			return nil, err
		}
		means = append(means, m)
	}
	slices.Sort(means)
	return &Latency{P50: means[(len(means)-1)/2], N: n * k}, nil
}
