package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// The test binary is its own server process, as the app binary is.
	if os.Getenv(envRole) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

// parseRows reads run's output: one JSON array of records a line, notes
// after #.
func parseRows(t *testing.T, out []byte) (rows [][]Record, notes []string) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) > 0 && line[0] == '#' {
			notes = append(notes, string(line))
			continue
		}
		var row []Record
		if err := json.Unmarshal(line, &row); err != nil {
			t.Fatalf("bad line %q: %v", line, err)
		}
		rows = append(rows, row)
	}
	return rows, notes
}

// Every case runs on every transport between two real processes and
// yields its metrics, positive; the idle case holds the connections asked
// for and counts the server's threads.
func TestRunAllCases(t *testing.T) {
	const idle = 40
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := run(ctx, &out, []string{"-rounds", "2", "-slice", "5ms", "-warm", "1ms", "-unary", "64,65536",
		"-calls", "64", "-callers", "4", "-bidi", "64", "-http", "1024", "-clients", "1,4", "-idle", fmt.Sprint(idle)})
	if err != nil {
		t.Fatal(err)
	}
	rows, notes := parseRows(t, out.Bytes())
	if len(notes) > 0 {
		t.Errorf("notes: %q", notes)
	}
	got := map[string]map[string]float64{} // case transport size → metric → value
	for _, row := range rows {
		for _, r := range row {
			k := fmt.Sprintf("%s %s %d", r.Case, r.Transport, r.Size)
			if got[k] == nil {
				got[k] = map[string]float64{}
			}
			if r.Suite != suiteName {
				t.Errorf("%s: suite %q", k, r.Suite)
			}
			got[k][r.Metric] = r.Value
		}
	}
	lat := []string{metricLatMin, metricLatP50, metricLatP99, metricLatP999}
	rate := []string{metricBW, metricBWMin, metricBWMax, metricRate}
	var want []string
	check := func(k string, metrics []string) {
		want = append(want, k)
		for _, m := range metrics {
			if v, ok := got[k][m]; !ok || !(v > 0) {
				t.Errorf("%s: %s = %v (present %v)", k, m, v, ok)
			}
		}
	}
	for _, tr := range []string{"sandirect", "unix", "tcp"} {
		check("unary grpc/"+tr+" 64", lat)
		check("unary grpc/"+tr+" 65536", lat)
		check("unary-c4 grpc/"+tr+" 64", rate)
		check("bidi grpc/"+tr+" 64", rate)
		check("get-c1 http/"+tr+" 1024", rate)
		check("get-c4 http/"+tr+" 1024", rate)
	}
	for _, tr := range idleTransports {
		k := "idle " + tr + " 0"
		check(k, []string{metricThreads, metricProcs, metricWake})
		if got[k][metricConns] != idle {
			t.Errorf("%s: %v connections, want %d", k, got[k][metricConns], idle)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d rows, want %d: %v", len(got), len(want), got)
	}
	if m := got["unary grpc/sandirect 64"]; m[metricLatMin] > m[metricLatP50] || m[metricLatP50] > m[metricLatP99] {
		t.Errorf("quantiles out of order: %v", m)
	}
}

func TestRunBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-unary", "0"}, `bad size or count "0"`},
		{[]string{"-http", "1k"}, `bad size or count "1k"`},
		{[]string{"-cases", "unary,rpc"}, `unknown case "rpc"`},
		{[]string{"-rounds", "0"}, "bad plan"},
		{[]string{"-callers", "0"}, "-callers 0"},
		{[]string{"-calls", "64,x"}, `bad size or count "x"`},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-spin", "-1us"}, "-spin -1µs"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := run(context.Background(), &bytes.Buffer{}, tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%q) = %v, want an error with %q", tc.args, err, tc.want)
			}
		})
	}
}

// A server process that cannot start its role fails the run with its
// reason, rather than hanging.
func TestChildFailureSurfaced(t *testing.T) {
	c, err := startChild(context.Background(), "idle", "-transport", "carrier-pigeon")
	if err != nil {
		t.Fatal(err)
	}
	var h idleHello
	err = c.readJSON(&h, childStartMax)
	if err == nil || !strings.Contains(err.Error(), `unknown transport "carrier-pigeon"`) {
		t.Fatalf("readJSON = %v, want the child's reason", err)
	}
	if err := c.stop(); err == nil {
		t.Error("stop: the failed child exited 0")
	}
}

// The rounds interleave the transports, each first in turn, after one
// warm-up each; a failure noted by fail lets the run go on and is
// returned at its end.
func TestInterleave(t *testing.T) {
	o := options{rounds: 4, slice: 2, warm: 1}
	var got []string
	err := interleave(o, func(tr transport, d time.Duration, keep bool) error {
		got = append(got, fmt.Sprintf("%s/%v/%v", tr.name, d, keep))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "sandirect/1ns/false unix/1ns/false tcp/1ns/false " +
		"sandirect/2ns/true unix/2ns/true tcp/2ns/true unix/2ns/true tcp/2ns/true sandirect/2ns/true " +
		"tcp/2ns/true sandirect/2ns/true unix/2ns/true sandirect/2ns/true unix/2ns/true tcp/2ns/true"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("order:\n%s\nwant\n%s", s, want)
	}

	var out bytes.Buffer
	w := &rowWriter{w: &out}
	if err := w.fail(context.Background(), fmt.Errorf("unary 64 B over unix: %w", os.ErrDeadlineExceeded)); err != nil {
		t.Fatal(err)
	}
	if out.String() != "# FAILED unary 64 B over unix: i/o timeout\n" || len(w.failed) != 1 {
		t.Errorf("fail wrote %q, kept %v", out.String(), w.failed)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.fail(ctx, context.Canceled); err == nil {
		t.Error("fail after the run was cancelled went on")
	}
}

// Sixteen net/http clients at once over each transport, for seconds, as
// in the suite: no request may hang (each slice has sliceMax to finish).
// This is the load under which a wake-up design that passed every other
// test lost wake-ups: every waiter of a process asleep with work pending.
func TestHTTPConcurrentClients(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := run(ctx, &out, []string{"-cases", "http", "-rounds", "4", "-slice", "1s", "-warm", "100ms",
		"-http", "1024", "-clients", "16"})
	if err != nil {
		t.Fatal(err)
	}
	rows, notes := parseRows(t, out.Bytes())
	if len(notes) > 0 {
		t.Errorf("notes: %q", notes)
	}
	var got []string
	for _, row := range rows {
		for _, r := range row {
			if r.Metric == metricRate {
				got = append(got, r.Transport)
			}
		}
	}
	if strings.Join(got, ",") != "http/sandirect,http/unix,http/tcp" {
		t.Errorf("rate rows for %v, want http/sandirect, http/unix and http/tcp", got)
	}
}

// TestCPUProfile: -cpuprofile writes a profile of the client and one of
// the server process, each a gzipped pprof protobuf.
func TestCPUProfile(t *testing.T) {
	prefix := t.TempDir() + "/p"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out, []string{"-rounds", "1", "-slice", "5ms", "-warm", "1ms", "-cases", "http",
		"-http", "1024", "-clients", "1", "-cpuprofile", prefix})
	if err != nil {
		t.Fatal(err)
	}
	for _, side := range []string{"client", "server"} {
		b, err := os.ReadFile(prefix + "." + side + ".pprof")
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s profile: %d bytes, not gzipped", side, len(b))
		}
	}
	if os.Getenv(envProfile) != "" {
		t.Errorf("%s still set after the run", envProfile)
	}
}

// -spin gives sandirect's connections in both processes that adaptive
// Spin, through the environment the server inherits, and only for the
// run; without it they have the default Config, whatever the caller's
// environment says.
func TestSpin(t *testing.T) {
	t.Setenv(envSpin, "1ms") // stale: -spin's absence must clear it
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{"-rounds", "1", "-slice", "5ms", "-warm", "1ms", "-cases", "unary", "-unary", "64"}
	if err := run(ctx, &bytes.Buffer{}, args); err != nil {
		t.Fatal(err)
	}
	if v, ok := os.LookupEnv(envSpin); ok || sandirectConfig() != nil {
		t.Fatalf("after a run without -spin: %s=%q, config %+v", envSpin, v, sandirectConfig())
	}
	var out bytes.Buffer
	if err := run(ctx, &out, append(args, "-spin", "300us")); err != nil {
		t.Fatal(err)
	}
	if rows, _ := parseRows(t, out.Bytes()); len(rows) == 0 {
		t.Fatal("a run with -spin wrote no records")
	}
	if v, ok := os.LookupEnv(envSpin); ok {
		t.Fatalf("%s=%q still set after the run", envSpin, v)
	}
	t.Setenv(envSpin, "300us")
	if c := sandirectConfig(); c == nil || c.Wait.Spin != 300*time.Microsecond {
		t.Fatalf("%s=300us: config %+v", envSpin, c)
	}
}
