package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRunConn runs the conn suite end to end in its tiny plan: every
// transport between two real processes, shmipc-go when its module builds
// here, memory per idle connection, and the report files.
func TestRunConn(t *testing.T) {
	tiny(t)
	dir := t.TempDir()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, &out, []string{"-quick", "-out", dir, "conn"}); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("output:\n%s", out.String())
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
	transports := []string{}
	for _, tr := range connTransports {
		transports = append(transports, tr.name)
	}
	if !strings.Contains(out.String(), "shmipc skipped") {
		transports = append(transports, "shmipc")
	} else {
		t.Logf("shmipc-go not measured: %s", grepLine(out.String(), "shmipc skipped"))
	}
	// The peers where their tools are installed (else the table says why).
	for _, p := range []struct {
		env, tool, pkg string
		transports     []string
	}{
		{envUCX, "ucx_perftest", "ucx-utils", []string{"ucx/tag", "ucx/stream"}},
		{envOFI, "fi_pingpong", "libfabric-bin", []string{ofiTransport}},
	} {
		if _, err := toolPath(p.env, p.tool, p.pkg); err != nil {
			if !strings.Contains(out.String(), "apt-get install "+p.pkg) {
				t.Errorf("%s not measured and the table does not say why (%v)", p.tool, err)
			}
			continue
		}
		transports = append(transports, p.transports...)
	}
	for _, tr := range transports {
		for _, size := range []int{8, 64 * kiB} {
			if v := got[recordKey{"conn", "pingpong", tr, size, metricLatP50}]; !(v > 0) {
				t.Errorf("%s pingpong %s p50 = %v", tr, fsize(size), v)
			}
			// Where the vCPUs were when the row ran: ours and the
			// peers', whose ratios the targets take.
			if v := got[recordKey{"conn", "pingpong", tr, size, metricHandoff}]; tr != "shmipc" && !(v > 0) {
				t.Errorf("%s pingpong %s: hand-off before the row = %v", tr, fsize(size), v)
			}
		}
		if tr == ofiTransport {
			continue // fi_pingpong has no stream mode
		}
		for _, size := range []int{64, 64 * kiB} {
			k := recordKey{"conn", "stream", tr, size, metricBW}
			bw := got[k]
			k.metric = metricBWMin
			lo := got[k]
			k.metric = metricBWMax
			hi := got[k]
			if !(bw > 0 && lo <= bw && bw <= hi) {
				t.Errorf("%s stream %s: GB/s %v, range %v-%v", tr, fsize(size), bw, lo, hi)
			}
		}
	}
	// The peers' rows come right after ours of the same case and size,
	// before ours of the next size: the targets compare rows measured
	// seconds apart (pairedTransport).
	if slices.Contains(transports, "ucx/tag") {
		row := func(cas, tr string, size int) int {
			for i, line := range strings.Split(out.String(), "\n") {
				if f := strings.Fields(line); len(f) > 2 && f[0] == cas && f[1] == tr && f[2] == fsize(size) {
					return i
				}
			}
			return -1
		}
		ours, theirs, next := row("pingpong", peerTargetTransport, 8), row("pingpong", "ucx/tag", 8), row("pingpong", peerTargetTransport, 64*kiB)
		if ours < 0 || !(ours < theirs && theirs < next) {
			t.Errorf("rows of %s 8 B at line %d, ucx/tag 8 B at %d, %s 64 KiB at %d: not paired", peerTargetTransport, ours, theirs, peerTargetTransport, next)
		}
	}
	if v := got[recordKey{"conn", "idle", connIdleTransport, 0, metricMem}]; !(v > 0) {
		t.Errorf("idle connection memory = %v", v)
	}
	for _, name := range []string{"bench.json", "conn.svg", "conn.png"} {
		if !strings.Contains(out.String(), filepath.Join(dir, name)) {
			t.Errorf("output does not name report file %s", name)
		}
	}
	checkPNG(t, filepath.Join(dir, "conn.png"))
}

// The targets against the best peer divide by the best one measured and
// name it: the least latency, the most bandwidth, whichever peer it is.
func TestPeerTargets(t *testing.T) {
	recs := []Record{
		{"conn", "pingpong", "sockets/busy", 8, metricLatP50, 300},
		{"conn", "pingpong", "ucx/tag", 8, metricLatP50, 200},
		{"conn", "pingpong", "ucx/stream", 8, metricLatP50, 150},
		{"conn", "pingpong", ofiTransport, 8, metricLatP50, 400},
		{"conn", "stream", "sockets/busy", 16 * miB, metricBW, 12},
		{"conn", "stream", "ucx/tag", 16 * miB, metricBW, 10},
		{"conn", "stream", "ucx/stream", 16 * miB, metricBW, 6},
		{"conn", "stream", "sockets/busy", 64, metricBW, 1}, // no peer measured: no line
	}
	var out bytes.Buffer
	printTargets(&out, recs, 0)
	words := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{
		"sockets/busy 8B p50 / ucx/stream (best) 300.0 150.0 2.00 <=1 MISS",
		"sockets/busy stream 16MiB / ucx/tag (best) 12.00 10.00 1.20 >=1.5 MISS",
	} {
		if !strings.Contains(words, want) {
			t.Errorf("targets lack %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "stream 64B") {
		t.Errorf("a target without any peer measured was printed:\n%s", out.String())
	}
}

// A target against the best peer says when the cache-line hand-offs
// measured before its two rows differ by more than handoffApart: the
// host moved the vCPUs between them, and the ratio compares two
// placements. Verdicts stand either way.
func TestPeerTargetsHandoff(t *testing.T) {
	for _, c := range []struct {
		ours, theirs float64
		note         bool
	}{
		{240, 245, false}, {240, 80, true}, {80, 240, true}, {240, 0, false},
	} {
		recs := []Record{
			{"conn", "pingpong", "sockets/busy", 8, metricLatP50, 300},
			{"conn", "pingpong", "sockets/busy", 8, metricHandoff, c.ours},
			{"conn", "pingpong", "ucx/tag", 8, metricLatP50, 200},
		}
		if c.theirs > 0 {
			recs = append(recs, Record{"conn", "pingpong", "ucx/tag", 8, metricHandoff, c.theirs})
		}
		var out bytes.Buffer
		printTargets(&out, recs, 0)
		line := grepLine(out.String(), "sockets/busy 8B p50 / ucx/tag (best)")
		if line == "" || !strings.Contains(line, "MISS") {
			t.Fatalf("hand-offs %v/%v: target line %q", c.ours, c.theirs, line)
		}
		if got := strings.Contains(line, "the vCPUs moved between the rows"); got != c.note {
			t.Errorf("hand-offs %v/%v: note %v, want %v: %q", c.ours, c.theirs, got, c.note, line)
		}
	}
}

func grepLine(text, s string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 400 {
		t.Errorf("%s is %dx%d", path, b.Dx(), b.Dy())
	}
}

// The shmipc-go module builds wherever its dependencies can be had: a
// compile error fails; a missing network for the first download skips.
func TestShmipcModuleBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	ctx, cancel := context.WithTimeout(context.Background(), shmipcBuildMax)
	defer cancel()
	_, err := buildShmipc(ctx, t.TempDir())
	if err == nil {
		return
	}
	msg := err.Error()
	for _, s := range []string{"dial tcp", "lookup ", "proxy", "connection refused", "i/o timeout", "no go command", "not found (tried"} {
		if strings.Contains(msg, s) {
			t.Skipf("shmipc-go cannot be had here: %v", err)
		}
	}
	t.Fatal(err)
}

func TestShmipcSkippedByEnv(t *testing.T) {
	t.Setenv(envShmipc, "0")
	if _, err := shmipcDir(); !errors.Is(err, errShmipcSkipped) {
		t.Fatalf("shmipcDir with %s=0: %v", envShmipc, err)
	}
}

// The report draws what it is given: several suites, cases and spreads,
// floors as references, one figure per suite in both formats.
func TestReport(t *testing.T) {
	var recs []Record
	add := func(suite, cas, tr string, size int, m string, v float64) {
		recs = append(recs, Record{suite, cas, tr, size, m, v})
	}
	add("floor", "pingpong", "cacheline", 8, metricLatP50, 60)
	add("floor", "pingpong", "futex", 4, metricLatP50, 11000)
	for _, size := range []int{4 * kiB, miB, 16 * miB} {
		add("floor", "copy", "memcpy", size, metricBW, 20)
		add("floor", "copy", "memcpy", size, metricBWMin, 18)
		add("floor", "copy", "memcpy", size, metricBWMax, 22)
	}
	for i, tr := range []string{"unix", "sockets/busy", "shmipc"} {
		for _, size := range []int{8, 4 * kiB, miB} {
			v := float64(1000*(i+1) + size/100)
			add("conn", "pingpong", tr, size, metricLatMin, v*0.8)
			add("conn", "pingpong", tr, size, metricLatP50, v)
			add("conn", "pingpong", tr, size, metricLatP99, v*3)
			add("conn", "pingpong", tr, size, metricLatP999, v*9)
			add("conn", "stream", tr, size, metricBW, float64(size)/1e5)
			add("conn", "stream", tr, size, metricBWMin, float64(size)/1.2e5)
			add("conn", "stream", tr, size, metricBWMax, float64(size)/0.9e5)
		}
	}
	add("conn", "idle", connIdleTransport, 0, metricMem, 200*kiB)
	dir := t.TempDir()
	paths, err := writeReport(dir, recs, "Test CPU, 2 CPUs")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"bench.json", "floor.svg", "floor.png", "conn.svg", "conn.png"}
	if len(paths) != len(want) {
		t.Fatalf("wrote %v, want %v", paths, want)
	}
	for i, w := range want {
		if paths[i] != filepath.Join(dir, w) {
			t.Errorf("path %d = %s, want %s", i, paths[i], w)
		}
	}
	checkPNG(t, filepath.Join(dir, "conn.png"))
	svg, err := os.ReadFile(filepath.Join(dir, "conn.svg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"sockets/busy", "shmipc", "Test CPU, 2 CPUs", "floor: single-core copy()",
		"floor: cache-line hand-off", "message size (bytes)", "GB/s"} {
		if !bytes.Contains(svg, []byte(s)) {
			t.Errorf("conn.svg lacks %q", s)
		}
	}
}

func TestProgressBar(t *testing.T) {
	var term, out bytes.Buffer
	p := newProgressBar(&term, 4)
	w := p.writer(&out)
	p.step("conn", "pingpong unix 8B")
	w.Write([]byte("a row\n"))
	p.step("conn", "pingpong unix 64B")
	p.stop()
	if out.String() != "a row\n" {
		t.Errorf("table output %q", out.String())
	}
	s := term.String()
	for _, want := range []string{"] 1/4 rows, last: conn pingpong unix 8B", "] 2/4 rows, last: conn pingpong unix 64B", "\r\x1b[K"} {
		if !strings.Contains(s, want) {
			t.Errorf("bar output %q lacks %q", s, want)
		}
	}
	if !strings.HasSuffix(s, "\r\x1b[K") {
		t.Errorf("bar not cleared at the end: %q", s)
	}
}
