package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// The parser reads what fi_pingpong (libfabric 1.17) printed here
// (testdata), and refuses what it cannot trust.
func TestParseFiPingpong(t *testing.T) {
	for _, tc := range []struct {
		file string
		want ofiResult
	}{
		{"fi_pingpong_8B.txt", ofiResult{Size: 8, Iters: 100000, MBps: 0.15, UsecPer: 54.07}},
		{"fi_pingpong_64KiB.txt", ofiResult{Size: 64 * kiB, Iters: 5000, MBps: 111.49, UsecPer: 587.82}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := parseFiPingpong(readTestdata(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("got %+v, want [%+v]", got, tc.want)
			}
		})
	}
	const header = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n"
	for _, tc := range []struct{ name, out, want string }{
		{"empty", "", "no result"},
		{"error only", "fi_getinfo(): util/pingpong.c:1150, ret=-61 (No data available)\n", "no result"},
		{"header only", header, "no result"},
		{"unacknowledged", header + "8       100k    +5       1.5m        0.91s      1.77       4.53       0.22\n", "not every message acknowledged"},
		{"bad size", header + "8x      100k    =100k    1.5m        0.91s      1.77       4.53       0.22\n", `bad count "8x"`},
		{"bad time", header + "8       100k    =100k    1.5m        0.91s      1.77       nan?       0.22\n", "bad result line"},
		{"zero", header + "8       0       =0       0           0.00s      0.00       0.00       0.00\n", "empty result line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFiPingpong(tc.out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseSuffixed(t *testing.T) {
	for _, tc := range []struct {
		s    string
		unit float64
		want int64
	}{
		{"8", 1024, 8}, {"64k", 1024, 64 << 10}, {"1.5m", 1000, 1_500_000}, {"3.9g", 1000, 3_900_000_000},
		{"1m", 1024, 1 << 20}, {"100k", 1000, 100_000},
	} {
		if got, err := parseSuffixed(tc.s, tc.unit); err != nil || got != tc.want {
			t.Errorf("parseSuffixed(%q, %v) = %d, %v; want %d", tc.s, tc.unit, got, err, tc.want)
		}
	}
	for _, s := range []string{"", "k", "-1", "1x"} {
		if _, err := parseSuffixed(s, 1000); err == nil {
			t.Errorf("parseSuffixed(%q) accepted", s)
		}
	}
}

func FuzzParseFiPingpong(f *testing.F) {
	f.Add("bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n" +
		"8       100k    =100k    1.5m        0.91s      1.77       4.53       0.22\n")
	f.Fuzz(func(t *testing.T, out string) {
		rs, err := parseFiPingpong(out)
		for _, r := range rs {
			if err == nil && (r.Iters <= 0 || !(r.UsecPer > 0) || r.Size < 0) {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}

// TestRunOFI runs fi_pingpong end to end: real servers and clients on the
// shm provider, pinned, at the tiny plan's ping-pong sizes.
func TestRunOFI(t *testing.T) {
	needTool(t, envOFI, "fi_pingpong", "libfabric-bin")
	env, out := toolEnv(t, "conn")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recs, err := runOFI(ctx, env)
	if err != nil {
		t.Fatalf("runOFI: %v\n%s", err, out)
	}
	ping, _ := connSizes(env)
	if len(recs) != len(ping) {
		t.Fatalf("%d records, want one p50 per size %v:\n%s", len(recs), ping, out)
	}
	for i, r := range recs {
		if r.Case != "pingpong" || r.Transport != ofiTransport || r.Size != ping[i] || r.Metric != metricLatP50 || !(r.Value > 0) {
			t.Errorf("record %d: %+v", i, r)
		}
	}
	if !strings.Contains(out.String(), "no stream mode") {
		t.Errorf("output does not say why ofi/shm has no stream rows:\n%s", out)
	}
}

func TestRunOFISkipped(t *testing.T) {
	t.Setenv(envOFI, "/nonexistent/fi_pingpong")
	env, out := toolEnv(t, "conn")
	recs, err := runOFI(context.Background(), env)
	if err != nil || len(recs) != 0 {
		t.Fatalf("runOFI without the tool: %v, %v", recs, err)
	}
	if want := "not installed (apt-get install libfabric-bin"; !strings.Contains(out.String(), want) {
		t.Fatalf("output lacks %q:\n%s", want, out)
	}
}
