package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/pin"
)

func TestMain(m *testing.M) {
	// The test binary is its own peer, as the bench binary is.
	if role := os.Getenv(envPeer); role != "" {
		os.Exit(peerMain(role))
	}
	if addr := os.Getenv(envFirstDial); addr != "" {
		os.Exit(firstDialMain(addr))
	}
	testutil.Main(m, pin.CloseIdleMonitors) // the devices' idle eBPF monitor (pin.SetIdleMonitorLinger)
}

func init() {
	registerPeer("test-fail", func(pc *peerConn) error {
		return pc.serve(func(cmd ctlMsg) error {
			fmt.Fprintln(os.Stderr, "peer says: about to fail")
			return errors.New("refused " + cmd.Op)
		})
	})
	registerPeer("test-hang", func(pc *peerConn) error {
		return pc.serve(func(cmd ctlMsg) error {
			if err := pc.ready(); err != nil {
				return err
			}
			select {} // until killed
		})
	})
	// Answers three netpoll round trips, then dies without answering the
	// fourth.
	registerPeer("test-netpoll-die", func(pc *peerConn) error {
		pp := openPollPipes(firstSegFd)
		return pc.serve(func(cmd ctlMsg) error {
			if err := pc.ready(); err != nil {
				return err
			}
			var b [1]byte
			for range 3 {
				if _, err := io.ReadFull(pp.in, b[:]); err != nil {
					return err
				}
				if err := sys.PipeSignal(pp.outFd); err != nil {
					return err
				}
			}
			io.ReadFull(pp.in, b[:])
			fmt.Fprintln(os.Stderr, "peer says: dying mid-round")
			os.Exit(3)
			return nil
		})
	})
	registerPeer("test-crash", func(pc *peerConn) error {
		return pc.serve(func(cmd ctlMsg) error {
			if err := pc.ready(); err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, "peer says: crashing")
			os.Exit(3)
			return nil
		})
	})
}

// tiny makes run measure for milliseconds instead of seconds.
func tiny(t *testing.T) {
	testTiny = true
	t.Cleanup(func() { testTiny = false })
}

func TestRunFloorRingJSON(t *testing.T) {
	tiny(t)
	path := filepath.Join(t.TempDir(), "out.json")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, &out, []string{"-quick", "-json", path, "-out", "", "floor", "ring"}); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("output:\n%s", out.String())

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []Record
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatalf("parse JSON: %v\n%s", err, b)
	}
	// The raw form must use exactly the agreed field names.
	var raw []map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	wantFields := []string{"case", "metric", "size", "suite", "transport", "value"}
	for _, r := range raw {
		var keys []string
		for k := range r {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, wantFields) {
			t.Fatalf("record fields %v, want %v", keys, wantFields)
		}
	}

	got := map[recordKey]float64{}
	for _, r := range recs {
		k := recordKey{r.Suite, r.Case, r.Transport, r.Size, r.Metric}
		if _, dup := got[k]; dup {
			t.Errorf("duplicate record %+v", k)
		}
		got[k] = r.Value
	}
	lat := []string{metricLatMin, metricLatP50, metricLatP99, metricLatP999}
	bw := []string{metricBW, metricBWMin, metricBWMax, metricRate} // measured in chunks: with the spread
	want := []struct {
		suite, cas, transport string
		size                  int
		metrics               []string
	}{
		{"floor", "pingpong", "cacheline", 8, lat},
		{"floor", "pingpong", "futex", 4, lat},
		{"floor", "pingpong", "futex/unpinned", 4, lat},
		{"floor", "pingpong", "futexcond/unpinned", 4, lat},
		{"floor", "pingpong", "netpoll", 1, lat},
		{"floor", "copy", "memcpy", 4 * kiB, bw},
		{"floor", "copy", "memcpy", 64 * kiB, bw},
		{"floor", "stream", "pipeline/cached", 64 * kiB, bw},
		{"floor", "stream", "pipeline/nt", 64 * kiB, bw},
		{"floor", "stream", "pipeline/best", 64 * kiB, bw},
		{"ring", "pingpong", "ring/busy", 8, lat},
		{"ring", "pingpong", "ring/busy", 4 * kiB, lat},
		{"ring", "pingpong", "ring/block", 8, lat},
		{"ring", "pingpong", "cacheline", 8, lat}, // the targets' interleaved references
		{"ring", "pingpong", "futex", 4, lat},
		{"ring", "pingpong", "netpoll", 1, lat},
		{"ring", "stream", "ring/busy", 64, bw},
		{"ring", "stream", "ring/busy", 64 * kiB, bw},
	}
	n := 0
	for _, w := range want {
		for _, m := range w.metrics {
			n++
			v, ok := got[recordKey{w.suite, w.cas, w.transport, w.size, m}]
			switch {
			case !ok:
				t.Errorf("no record %s/%s/%s/%d/%s", w.suite, w.cas, w.transport, w.size, m)
			case !(v > 0):
				t.Errorf("record %s/%s/%s/%d/%s = %v, want > 0", w.suite, w.cas, w.transport, w.size, m, v)
			}
		}
	}
	if len(recs) != n {
		t.Errorf("%d records, want %d", len(recs), n)
	}
	for _, r := range recs {
		if strings.HasPrefix(r.Metric, "lat_") {
			p50 := got[recordKey{r.Suite, r.Case, r.Transport, r.Size, metricLatP50}]
			min := got[recordKey{r.Suite, r.Case, r.Transport, r.Size, metricLatMin}]
			p999 := got[recordKey{r.Suite, r.Case, r.Transport, r.Size, metricLatP999}]
			if !(min <= p50 && p50 <= p999) {
				t.Errorf("%s/%s/%d: min %v, p50 %v, p99.9 %v out of order", r.Case, r.Transport, r.Size, min, p50, p999)
			}
		}
	}

	text := out.String()
	for _, s := range []string{"--- floor", "--- ring", "--- targets", "cacheline", "ring/block", "memcpy"} {
		if !strings.Contains(text, s) {
			t.Errorf("table lacks %q", s)
		}
	}
	ran := func(suite string) bool { return suite == "floor" || suite == "ring" }
	wantVerdicts := 0
	for _, tg := range targets {
		if ran(tg.num.suite) && ran(tg.den.suite) {
			wantVerdicts++
		}
	}
	if c := strings.Count(text, "PASS") + strings.Count(text, "MISS"); c != wantVerdicts {
		t.Errorf("%d target verdicts, want %d", c, wantVerdicts)
	}
}

// TestRunRDMA runs the rdma suite end to end in its tiny plan: two real
// processes, both memory kinds, every perftest case.
func TestRunRDMA(t *testing.T) {
	tiny(t)
	path := filepath.Join(t.TempDir(), "out.json")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, &out, []string{"-quick", "-json", path, "-out", "", "rdma"}); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	b, err := os.ReadFile(path)
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
	for _, k := range []recordKey{
		{"rdma", "send_lat", "nic/shm", 8, metricLatP50},
		{"rdma", "write_lat", "nic/shm", 8, metricLatP50},
		{"rdma", "read_lat", "nic/cma", 8, metricLatP50},
		{"rdma", "write_bw", "nic/shm", 64 * kiB, metricBW},
		{"rdma", "read_bw", "nic/cma", 64 * kiB, metricBW},
		{"rdma", "write_bw", "cma/raw", 64 * kiB, metricBW},
		{"rdma", "send_bw", "nic/shm", 4 * kiB, metricRate},
		{"rdma", "write_lat", "nic/shm", 8, metricHandoff}, // where the vCPUs were: the target's row
	} {
		if v := got[k]; !(v > 0) {
			t.Errorf("record %+v = %v, want > 0\n%s", k, v, out.String())
		}
	}
	// UCX's put and get beside ours, where ucx_perftest is installed.
	if _, err := toolPath(envUCX, "ucx_perftest", "ucx-utils"); err != nil {
		t.Logf("UCX not measured: %v", err)
		return
	}
	for _, k := range []recordKey{
		{"rdma", "write_lat", "ucx/put", 8, metricLatP50},
		{"rdma", "write_lat", "ucx/put", 8, metricHandoff},
		{"rdma", "write_bw", "ucx/put", 64 * kiB, metricBW},
		{"rdma", "read_lat", "ucx/get", 8, metricLatP50},
		{"rdma", "read_bw", "ucx/get", 64 * kiB, metricBW},
	} {
		if v := got[k]; !(v > 0) {
			t.Errorf("record %+v = %v, want > 0\n%s", k, v, out.String())
		}
	}
	if !strings.Contains(out.String(), "nic/shm write_lat 8B p50 / ucx/put 8B p50") {
		t.Errorf("no verdict on the write_lat target:\n%s", out.String())
	}
}

func TestRunErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nosuch"}, `unknown suite "nosuch"`},
		{[]string{"-nosuchflag"}, "flag provided but not defined"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := run(context.Background(), new(bytes.Buffer), tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, []string{"-h"}); err != nil {
		t.Fatalf("run -h: %v", err)
	}
	for _, s := range suites {
		if !strings.Contains(out.String(), s.Name) {
			t.Errorf("-h does not list suite %s:\n%s", s.Name, out.String())
		}
	}
}

func testEnv(t *testing.T) *Env {
	env, err := newEnv(context.Background(), new(bytes.Buffer), true, false)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// A peer's failure reaches the parent with what the peer printed.
func TestPeerErrorSurfaced(t *testing.T) {
	p, err := startPeer(testEnv(t), "test-fail")
	if err != nil {
		t.Fatal(err)
	}
	err = p.run(context.Background(), ctlMsg{Op: "hello"}, func(error) {}, func() error { return nil })
	if err == nil {
		t.Fatal("no error from a failing peer")
	}
	for _, s := range []string{"refused hello", "peer says: about to fail"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}
	<-p.exited // failure kills it
	p.close()
}

// A peer dying mid-measurement aborts the parent's side, and the error
// carries the peer's exit status and output.
func TestPeerCrashAborts(t *testing.T) {
	p, err := startPeer(testEnv(t), "test-crash")
	if err != nil {
		t.Fatal(err)
	}
	aborted := make(chan error, 1)
	err = p.run(context.Background(), ctlMsg{Op: "spin"}, func(err error) { aborted <- err }, func() error {
		select {
		case err := <-aborted:
			return fmt.Errorf("body: %w", err)
		case <-time.After(20 * time.Second):
			return errors.New("body was never aborted")
		}
	})
	if !errors.Is(err, errPeerExited) {
		t.Fatalf("err = %v, want errPeerExited", err)
	}
	for _, s := range []string{"exit status 3", "peer says: crashing"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}
	p.close()
}

// A peer that dies while the parent's goroutine is parked in the
// netpoller for its answer ends the netpoll round trips with the peer's
// exit, not a hang.
func TestNetpollPeerDies(t *testing.T) {
	pp, child, err := newPollPipes()
	if err != nil {
		t.Fatal(err)
	}
	defer pp.close()
	env := testEnv(t)
	p, err := startPeerFiles(env, "test-netpoll-die", child...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	smp := newSampler(100)
	smp.start(0)
	err = netpollRounds(context.Background(), env, p, &pp, 1, time.Hour, 100, smp)
	if !errors.Is(err, errPeerExited) {
		t.Fatalf("err = %v, want errPeerExited", err)
	}
	if !strings.Contains(err.Error(), "dying mid-round") {
		t.Errorf("error %q lacks the peer's last words", err)
	}
}

// Cancelling the context aborts the parent's side and kills the peer.
func TestPeerCancel(t *testing.T) {
	p, err := startPeer(testEnv(t), "test-hang")
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	aborted := make(chan error, 1)
	err = p.run(ctx, ctlMsg{Op: "spin"}, func(err error) { aborted <- err }, func() error {
		cancel()
		return <-aborted
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("peer still running after cancel")
	}
}

func TestSummarize(t *testing.T) {
	rtts := make([]int64, 1000)
	for i := range rtts {
		rtts[len(rtts)-1-i] = int64(2 * (i + 1)) // 2..2000, reversed
	}
	l := summarize(rtts)
	want := Latency{Min: 1, P50: 500, P99: 990, P999: 999, N: 1000}
	if *l != want {
		t.Fatalf("summarize = %+v, want %+v", *l, want)
	}
	if l := summarize([]int64{10}); l.Min != 5 || l.P50 != 5 || l.P999 != 5 {
		t.Fatalf("one sample: %+v", *l)
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int]string{8: "8B", 4096: "4KiB", 1536: "1536B", 1 << 20: "1MiB", 256 << 20: "256MiB"} {
		if got := fsize(n); got != want {
			t.Errorf("fsize(%d) = %q, want %q", n, got, want)
		}
	}
	for v, want := range map[float64]string{61.234: "61.23", 0.000123: "0.000123", 1234.5: "1234", 250.5: "250.5", 7.1: "7.100"} {
		if got := fnum(v); got != want {
			t.Errorf("fnum(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestRunPin(t *testing.T) {
	tiny(t)
	var out bytes.Buffer
	path := filepath.Join(t.TempDir(), "out.json")
	if err := run(context.Background(), &out, []string{"-quick", "-json", path, "-out", "", "pin"}); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []Record
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, r := range recs {
		if r.Size == miB && r.Metric == metricLatP50 {
			got[r.Transport] = r.Value
		}
	}
	if !(got["pin/cached"] > 0) || !(got["pin/uncached"] > got["pin/cached"]) {
		t.Fatalf("1 MiB register p50: %v\n%s", got, out.String())
	}
}

// TestPlansMeasureTargets: the full and quick plans measure every size a
// target of the rdma, conn and floor (copy) suites divides — a target
// whose rows a plan lacks is silently left out of the report (the full
// plan's rdma sizes, powers of 4 from 8 B, once skipped 1 and 16 MiB).
func TestPlansMeasureTargets(t *testing.T) {
	for _, quick := range []bool{false, true} {
		env := &Env{quick: quick, plan: fullPlan()}
		if quick {
			env.plan = quickPlan()
		}
		lat, bw := rdmaSizes(env)
		sizes := map[[2]string][]int{
			{"rdma", "send_lat"}: lat, {"rdma", "write_bw"}: bw, {"rdma", "read_bw"}: bw,
			{"conn", "pingpong"}: env.plan.connPingSizes, {"conn", "stream"}: env.plan.connStreamSizes,
			{"floor", "copy"}: env.plan.copySizes,
		}
		type pair struct {
			name string
			keys []recordKey
		}
		var all []pair
		for _, tg := range targets {
			all = append(all, pair{tg.name, []recordKey{tg.num, tg.den}})
		}
		for _, tg := range peerTargets {
			all = append(all, pair{tg.name, append([]recordKey{tg.num}, tg.peers...)})
		}
		for _, tg := range all {
			if quick && tg.keys[0].suite == "conn" && tg.keys[0].cas == "stream" && tg.keys[0].size == 4*miB {
				continue // the quick plan streams 1 and 16 MiB only
			}
			for _, k := range tg.keys {
				have, ok := sizes[[2]string{k.suite, k.cas}]
				if !ok {
					continue
				}
				if !slices.Contains(have, k.size) {
					t.Errorf("quick=%v: target %q needs %s/%s at %s; the plan measures %v", quick, tg.name, k.suite, k.cas, fsize(k.size), have)
				}
			}
		}
	}
}

// TestPipelineReaderUnpinnable: when the pipeline's reader thread cannot
// be pinned (a CPU that does not exist), the writer stops instead of
// waiting for it forever, and nothing is reported.
func TestPipelineReaderUnpinnable(t *testing.T) {
	env := &Env{plan: tinyPlan(), cpus: [2]int{0, 1 << 20}}
	if bw := pipelineRun(env, 64<<10, false); bw.P50 != 0 {
		t.Fatalf("a pipeline without its reader measured %+v", bw)
	}
}
