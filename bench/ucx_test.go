package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// envRequirePeers, when set (scripts/test.sh sets it once it has installed
// them), turns a missing peer tool from a skip into a failure.
const envRequirePeers = "SANDIRECT_BENCH_REQUIRE_PEERS"

// needTool returns the peer tool name, or skips (fails under
// envRequirePeers) where it is not installed.
func needTool(t *testing.T, envName, name, pkg string) string {
	t.Helper()
	p, err := toolPath(envName, name, pkg)
	if err != nil {
		if os.Getenv(envRequirePeers) != "" {
			t.Fatalf("%s is set, but: %v", envRequirePeers, err)
		}
		t.Skip(err)
	}
	return p
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The parser reads what ucx_perftest 1.13 printed here (testdata), and
// refuses what it cannot trust.
func TestParseUCXPerftest(t *testing.T) {
	for _, tc := range []struct {
		file string
		want ucxResult
	}{
		{"ucx_perftest_tag_lat.txt", ucxResult{Iters: 100000, Rank: 50, Percentile: 0.100, Avg: 0.508, Overall: 10.679,
			AvgMBps: 15.03, OverallMBps: 0.71, AvgRate: 1970078, OverallRate: 93645}},
		{"ucx_perftest_stream_lat_p99.txt", ucxResult{Iters: 20000, Rank: 99, Percentile: 0.883, Avg: 2.810, Overall: 2.810,
			AvgMBps: 1390.32, OverallMBps: 1390.32, AvgRate: 355923, OverallRate: 355923}},
		// Without -f: a line per report interval, "[thread 0]…", then the
		// final one, which alone counts.
		{"ucx_perftest_tag_bw_intervals.txt", ucxResult{Iters: 300000, Rank: 50, Percentile: 0.290, Avg: 719.113, Overall: 111.516,
			AvgMBps: 86.91, OverallMBps: 560.46, AvgRate: 1391, OverallRate: 8967}},
		{"ucx_perftest_ucp_get.txt", ucxResult{Iters: 20000, Rank: 50, Percentile: 0.021, Avg: 0.017, Overall: 0.017,
			AvgMBps: 453.90, OverallMBps: 453.90, AvgRate: 59493674, OverallRate: 59493674}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := parseUCXPerftest(readTestdata(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	if g := (ucxResult{OverallMBps: 1000}).gbps(); g != 1.048576 {
		t.Errorf("1000 MB/s of 2^20 bytes = %v GB/s, want 1.048576", g)
	}
	const header = "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n"
	for _, tc := range []struct{ name, out, want string }{
		{"empty", "", "no CSV header"},
		{"error only", "[1796155688.072116] [vm:22860:0] perftest.c:129  UCX  ERROR recv() failed\n", "no CSV header"},
		{"header only", header, "no final result"},
		{"intervals only", header + "[thread 0]52834,0.080,20.967,20.967,2980.81,2980.81,47693,47693\n", "no final result"},
		{"bad number", header + "100000,0.100,x,10.679,15.03,0.71,1970078,93645\n", `bad number "x"`},
		{"negative", header + "100000,-0.100,0.5,10.679,15.03,0.71,1970078,93645\n", `bad number "-0.100"`},
		{"unknown column", "iterations,median_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n", `unknown column "median_lat"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseUCXPerftest(tc.out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func FuzzParseUCXPerftest(f *testing.F) {
	for _, name := range []string{"ucx_perftest_tag_lat.txt", "ucx_perftest_tag_bw_intervals.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, out string) {
		r, err := parseUCXPerftest(out)
		if err == nil && (r.Iters <= 0 || r.Percentile < 0 || r.OverallMBps < 0) {
			t.Fatalf("accepted %+v", r)
		}
	})
}

// The iteration counts fill the budget at a guess, and never leave the
// percentile's 2048-iteration queue partly empty.
func TestUCXIterations(t *testing.T) {
	for _, tc := range []struct {
		size   int
		budget time.Duration
		most   int
		want   int
	}{
		{8, 100 * time.Millisecond, 1 << 30, 199203}, // 100 ms / (2 × 251 ns)
		{8, 100 * time.Millisecond, 50_000, 50_000},
		{miB, time.Millisecond, 1 << 30, 2 * ucxTimingQueue},
		{8, 0, 0, 2 * ucxTimingQueue},
	} {
		if got := latIters(tc.size, tc.budget, tc.most); got != tc.want {
			t.Errorf("latIters(%d, %v, %d) = %d, want %d", tc.size, tc.budget, tc.most, got, tc.want)
		}
	}
	if got := bwIters(16*miB, time.Millisecond); got != 20 {
		t.Errorf("bwIters(16 MiB, 1 ms) = %d, want the floor of 20", got)
	}
}

// toolEnv is a tiny-plan Env of suite, pinned as the bench pins where the
// machine has two CPUs.
func toolEnv(t *testing.T, suite string) (*Env, *bytes.Buffer) {
	t.Helper()
	tiny(t)
	var out bytes.Buffer
	env, err := newEnv(context.Background(), &out, true, true)
	if err != nil {
		t.Fatal(err)
	}
	env.suite = suite
	return env, &out
}

// TestRunUCX runs every UCX case of both suites end to end: real
// ucx_perftest servers and clients, pinned, at the tiny plan's sizes.
func TestRunUCX(t *testing.T) {
	needTool(t, envUCX, "ucx_perftest", "ucx-utils")
	for _, suite := range []string{"conn", "rdma"} {
		t.Run(suite, func(t *testing.T) {
			env, out := toolEnv(t, suite)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			recs, err := runUCX(ctx, env)
			if err != nil {
				t.Fatalf("runUCX: %v\n%s", err, out)
			}
			got := map[recordKey]float64{}
			for _, r := range recs {
				got[recordKey{r.Suite, r.Case, r.Transport, r.Size, r.Metric}] = r.Value
			}
			n := 0
			for _, c := range ucxCases {
				if c.suite != suite {
					continue
				}
				for _, size := range ucxSizes(env, suite, c.cas) {
					metrics := []string{metricLatP50, metricLatP99}
					if !c.lat {
						metrics = []string{metricBW, metricBWMin, metricBWMax, metricRate}
					}
					for _, m := range metrics {
						n++
						if v := got[recordKey{suite, c.cas, c.transport, size, m}]; !(v > 0) {
							t.Errorf("%s %s %s %s = %v", c.cas, c.transport, fsize(size), m, v)
						}
					}
					if !c.lat {
						k := recordKey{suite, c.cas, c.transport, size, metricBWMin}
						lo := got[k]
						k.metric = metricBWMax
						hi := got[k]
						k.metric = metricBW
						if bw := got[k]; !(lo <= bw && bw <= hi) {
							t.Errorf("%s %s %s: %v outside its range %v-%v", c.cas, c.transport, fsize(size), bw, lo, hi)
						}
					}
				}
			}
			if len(recs) != n {
				t.Errorf("%d records, want %d:\n%s", len(recs), n, out)
			}
			if !strings.Contains(out.String(), "UCX_TLS="+ucxTLS()) {
				t.Errorf("output does not say which UCX_TLS ran:\n%s", out)
			}
		})
	}
}

// Without the tool the suite says why, steps past the rows and reports
// nothing; a tool that fails is an error naming what failed.
func TestRunUCXSkippedOrBroken(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		skipped     bool
		want        string
	}{
		{"left out", "0", true, envUCX + "=0"},
		{"not installed", "/nonexistent/ucx_perftest", true, "not installed (apt-get install ucx-utils"},
		{"broken", "/bin/false", false, "exited before it listened on port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envUCX, tc.value)
			env, out := toolEnv(t, "conn")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			recs, err := runUCX(ctx, env)
			if len(recs) != 0 {
				t.Errorf("records from a missing or broken tool: %v", recs)
			}
			switch {
			case tc.skipped && err != nil:
				t.Fatalf("runUCX: %v", err)
			case tc.skipped && !strings.Contains(out.String(), tc.want):
				t.Fatalf("output lacks %q:\n%s", tc.want, out)
			case !tc.skipped && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			case !tc.skipped && !strings.Contains(out.String(), "FAILED"):
				t.Fatalf("the failure is not in the table:\n%s", out)
			}
		})
	}
}

// A peer tool's processes run on the CPU asked for: the child inherits
// the affinity of the thread that forked it.
func TestSpawnOnPins(t *testing.T) {
	env, _ := toolEnv(t, "conn")
	if env.cpus[0] < 0 {
		t.Skip("fewer than two CPUs allowed: nothing to pin to")
	}
	for _, cpu := range env.cpus {
		var out bytes.Buffer
		cmd := exec.Command("/bin/cat", "/proc/self/status")
		cmd.Stdout = &out
		if err := spawnOn(cmd, cpu); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if got := grepLine(out.String(), "Cpus_allowed_list:"); !strings.HasSuffix(got, "\t"+strconv.Itoa(cpu)) {
			t.Errorf("child started on CPU %d: %q", cpu, got)
		}
	}
	if err := spawnOn(exec.Command("/bin/true"), 1<<20); err == nil || !strings.Contains(err.Error(), "pin to CPU") {
		t.Errorf("spawnOn a CPU that does not exist: %v", err)
	}
}

// awaitListen sees a real listening socket, and an exited server.
func TestAwaitListen(t *testing.T) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := listening(port); ok || err != nil {
		t.Fatalf("listening(%d) on a closed port = %v, %v", port, ok, err)
	}
	done := make(chan error, 1)
	done <- errors.New("exit status 1")
	if err := awaitListen(context.Background(), port, done); err == nil || !strings.Contains(err.Error(), "exited before") {
		t.Fatalf("awaitListen with an exited server: %v", err)
	}
	l, err := listenNet(context.Background(), "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := awaitListen(context.Background(), port, make(chan error, 1)); err != nil {
		t.Fatalf("awaitListen with a listener: %v", err)
	}
}
