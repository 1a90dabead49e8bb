package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRunApp runs the app suite end to end in its tiny plan: bench/app
// built and run, its two processes per measurement, every case on every
// transport merged into the table, the side-by-side table, the targets
// and the report's figure.
func TestRunApp(t *testing.T) {
	tiny(t)
	dir := t.TempDir()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx, &out, []string{"-out", dir, "app"}); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("output:\n%s", out.String())
	if line := grepLine(out.String(), "module skipped"); line != "" {
		t.Skipf("bench/app could not be built here: %s", line)
	}
	b, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var recs []Record
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	got := map[recordKey]float64{}
	for _, r := range recs {
		got[recordKey{r.Suite, r.Case, r.Transport, r.Size, r.Metric}] = r.Value
	}
	p := appPlanOf(&Env{})
	for _, tr := range appTransports {
		for _, size := range p.unary {
			if v := got[recordKey{"app", "unary", "grpc/" + tr, size, metricLatP50}]; !(v > 0) {
				t.Errorf("unary grpc/%s %s p50 = %v", tr, fsize(size), v)
			}
		}
		for _, size := range p.calls {
			cas := "unary-c" + strings.TrimSpace(intList([]int{p.callers}))
			if v := got[recordKey{"app", cas, "grpc/" + tr, size, metricRate}]; !(v > 0) {
				t.Errorf("%s grpc/%s %s rate = %v", cas, tr, fsize(size), v)
			}
		}
		for _, size := range p.bidi {
			if v := got[recordKey{"app", "bidi", "grpc/" + tr, size, metricRate}]; !(v > 0) {
				t.Errorf("bidi grpc/%s %s rate = %v", tr, fsize(size), v)
			}
		}
		for _, c := range p.clients {
			cas := "get-c" + strings.TrimSpace(intList([]int{c}))
			for _, size := range p.httpSizes {
				if v := got[recordKey{"app", cas, "http/" + tr, size, metricRate}]; !(v > 0) {
					t.Errorf("%s http/%s %s rate = %v", cas, tr, fsize(size), v)
				}
			}
		}
	}
	for _, tr := range []string{appIdleTransport, "unix", "tcp"} {
		if v := got[recordKey{"app", "idle", tr, 0, appMetricConns}]; v != float64(p.idle) {
			t.Errorf("idle %s: %v connections, want %d", tr, v, p.idle)
		}
		if v := got[recordKey{"app", "idle", tr, 0, appMetricThreads}]; !(v > 0) {
			t.Errorf("idle %s: threads %v", tr, v)
		}
	}
	for _, s := range []string{"--- side by side: app", "grpc/sandirect", "app grpc unary 64B p50 / unix",
		"app http 1KiB 1 client(s) req/s / unix", "app idle conns: server threads - GOMAXPROCS",
		filepath.Join(dir, "app.svg"), filepath.Join(dir, "app.png")} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q", s)
		}
	}
	checkPNG(t, filepath.Join(dir, "app.png"))
}

// The app module builds wherever its dependencies can be had: a compile
// error fails; a missing network for the first download skips.
func TestAppModuleBuilds(t *testing.T) {
	for _, m := range []nestedModule{appModule, plotModule} {
		t.Run(m.dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), moduleBuildMax)
			defer cancel()
			_, err := m.build(ctx, t.TempDir())
			if err == nil {
				return
			}
			for _, s := range []string{"dial tcp", "lookup ", "proxy", "connection refused", "i/o timeout", "no go command"} {
				if strings.Contains(err.Error(), s) {
					t.Skipf("bench/%s cannot be had here: %v", m.dir, err)
				}
			}
			t.Fatal(err)
		})
	}
}

func TestNestedModuleSkippedByEnv(t *testing.T) {
	t.Setenv(appModule.env, "0")
	if _, err := appModule.find(); !errors.Is(err, errModuleSkipped) {
		t.Fatalf("find with %s=0: %v", appModule.env, err)
	}
	t.Setenv(appModule.env, t.TempDir()) // no go.mod there
	if _, err := appModule.build(context.Background(), t.TempDir()); !errors.Is(err, errModuleSkipped) {
		t.Fatalf("build of a directory without a module: %v", err)
	}
}

// The side-by-side table and the targets read the app records: ratios to
// the Unix socket, and the idle threads against GOMAXPROCS.
func TestAppTables(t *testing.T) {
	var recs []Record
	add := func(cas, tr string, size int, m string, v float64) {
		recs = append(recs, Record{"app", cas, tr, size, m, v})
	}
	add("unary", "grpc/sandirect", 64, metricLatP50, 100e3)
	add("unary", "grpc/unix", 64, metricLatP50, 200e3)
	add("unary", "grpc/tcp", 64, metricLatP50, 300e3)
	add("unary-c16", "grpc/sandirect", 64, metricRate, 0.031)
	add("unary-c16", "grpc/unix", 64, metricRate, 0.025)
	add("get-c16", "http/sandirect", kiB, metricRate, 0.012)
	add("get-c16", "http/unix", kiB, metricRate, 0.008)
	add("idle", appIdleTransport, 0, appMetricConns, 10000)
	add("idle", appIdleTransport, 0, appMetricThreads, 30)
	add("idle", appIdleTransport, 0, appMetricProcs, 2)
	add("idle", "unix", 0, appMetricConns, 10000)
	add("idle", "unix", 0, appMetricThreads, 7)
	var side, tgt bytes.Buffer
	printAppSideBySide(&side, recs)
	printTargets(&tgt, recs, 0)
	for _, tc := range []struct {
		out  *bytes.Buffer
		want string
	}{
		{&side, "unary 64B µs"},
		{&side, "100 (0.50)"}, // sandirect: half the unix call
		{&side, "300 (1.50)"},
		{&side, "12000 (1.50)"}, // req/s, not Mmsg/s
		{&side, "c16 64B/s"},
		{&side, "31000 (1.24)"}, // calls/s
		{&side, "10000 connections with a Read waiting, server threads (GOMAXPROCS 2): sockets/default 30, unix 7"},
		{&tgt, "app grpc unary 64B p50 / unix (interleaved)"},
		{&tgt, "0.50  <=0.7  PASS"},
		{&tgt, "1.50  >=1  PASS"},
		{&tgt, "28.00  <=20  MISS"},
	} {
		if !strings.Contains(tc.out.String(), tc.want) {
			t.Errorf("lacks %q:\n%s", tc.want, tc.out)
		}
	}
}

// The full and the quick plans measure every size and client count that
// the app targets need.
func TestAppPlansMeasureTargets(t *testing.T) {
	for _, quick := range []bool{false, true} {
		p := appPlanOf(&Env{quick: quick})
		for _, tg := range targets {
			if tg.num.suite != "app" {
				continue
			}
			switch cas := tg.num.cas; {
			case cas == "unary":
				if !slices.Contains(p.unary, tg.num.size) {
					t.Errorf("quick=%v: %q needs unary %s; the plan has %v", quick, tg.name, fsize(tg.num.size), p.unary)
				}
			case strings.HasPrefix(cas, "get-c"):
				c, err := strconv.Atoi(strings.TrimPrefix(cas, "get-c"))
				if err != nil || !slices.Contains(p.clients, c) || !slices.Contains(p.httpSizes, tg.num.size) {
					t.Errorf("quick=%v: %q needs %s at %s; the plan has %v clients, sizes %v", quick, tg.name, cas,
						fsize(tg.num.size), p.clients, p.httpSizes)
				}
			default:
				t.Errorf("target %q: unknown case %q", tg.name, cas)
			}
		}
		if p.idle < 10000 {
			t.Errorf("quick=%v: %d idle connections, issue 18 asks for 10,000", quick, p.idle)
		}
	}
}
