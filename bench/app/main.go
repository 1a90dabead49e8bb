// Command app measures what a Go application gets from sandirect: gRPC-go
// and net/http between two real processes, over sandirect with the
// default Config, a Unix socket and TCP loopback, and the OS threads that
// idle connections hold. It writes its numbers as records of the bench's
// JSON schema (suite "app"). It is a module of its own so that gRPC and
// its dependencies stay out of sandirect's go.mod; the bench's app suite
// builds and runs it (bench/app.go), and it runs by hand too:
//
//	go -C bench/app run . [-rounds N] [-slice D] [-warm D] [-unary SIZES] [-bidi SIZES]
//	    [-http SIZES] [-clients LIST] [-idle N] [-cases LIST] [-records FILE]
//
// This process is the client; it starts the server as this same binary
// re-executed (SANDIRECT_APP_ROLE set), which listens on all six
// transports at once. Transports are interleaved: every round measures
// each case on each transport for one slice, the transports' order
// rotating from round to round, so that a noisy host hits them alike.
//
// Cases:
//
//   - unary: gRPC unary calls of gRPC-go's own benchmark service
//     (grpc_testing.BenchmarkService.UnaryCall), request and response
//     payloads both of the size, one call at a time; latency per call
//     (a whole round trip, not half), min, p50, p99, p99.9 over all rounds.
//   - bidi: one bidirectional stream (StreamingCall) per slice, the client
//     sending messages of the size from one goroutine with up to
//     bidiWindow in flight, receiving the server's echo of the same size in
//     another; messages echoed per second (rate_mps, in millions) and
//     payload GB/s one way (bw_gbps), the median round and the range.
//   - get-c1, get-c16 (get-cN for -clients N): net/http keep-alive GETs of
//     a body of the size by N concurrent clients through one
//     http.Transport; requests per second (rate_mps, in millions) and body
//     GB/s (bw_gbps), the median round and the range.
//   - idle: -idle connections to a fresh server process whose goroutines
//     each wait in Read; the server's OS threads (/proc/self/status) with
//     its GOMAXPROCS, then every connection woken with a byte and its echo
//     awaited (wake_all_ns). RLIMIT_NOFILE's soft limit is raised to the
//     hard one, and fewer connections are opened if the limit is lower.
//
// Records go out as one JSON array per row and line to -records (default
// standard output); a line starting with # is a note.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const envRole = "SANDIRECT_APP_ROLE" // "server" or "idle" in the child

// envProfile, in a server child, names the file of its CPU profile (-cpuprofile).
const envProfile = "SANDIRECT_APP_CPUPROFILE"

// Record is one number, in the bench's schema (bench/suite.go).
type Record struct {
	Suite     string  `json:"suite"`
	Case      string  `json:"case"`
	Transport string  `json:"transport"`
	Size      int     `json:"size"`
	Metric    string  `json:"metric"`
	Value     float64 `json:"value"`
}

// Metric names, as in the bench; the idle case adds its own.
const (
	metricLatMin  = "lat_min_ns"
	metricLatP50  = "lat_p50_ns"
	metricLatP99  = "lat_p99_ns"
	metricLatP999 = "lat_p999_ns"
	metricBW      = "bw_gbps"
	metricBWMin   = "bw_min_gbps"
	metricBWMax   = "bw_max_gbps"
	metricRate    = "rate_mps"

	metricConns   = "conns"       // idle: connections held
	metricThreads = "threads"     // idle: the server's OS threads with them waiting
	metricProcs   = "gomaxprocs"  // idle: the server's GOMAXPROCS
	metricWake    = "wake_all_ns" // idle: a byte to every connection, every echo back
)

const suiteName = "app"

func main() {
	if os.Getenv(envRole) != "" {
		os.Exit(childMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "app:", strings.ReplaceAll(err.Error(), "\n", " | "))
		os.Exit(1)
	}
}

// childMain is the body of a server process (envRole set); it returns
// the exit status.
func childMain() int {
	if path := os.Getenv(envProfile); path != "" && os.Getenv(envRole) == "server" {
		stop, err := startProfile(path)
		if err != nil {
			return exitCode(err)
		}
		defer stop()
	}
	switch role := os.Getenv(envRole); role {
	case "server":
		return exitCode(serveMain(os.Stdin, os.Stdout))
	case "idle":
		return exitCode(idleMain(os.Stdin, os.Stdout, os.Args[1:]))
	default:
		return exitCode(fmt.Errorf("unknown %s %q", envRole, role))
	}
}

func exitCode(err error) int {
	if err != nil {
		fmt.Fprintln(os.Stderr, "app:", strings.ReplaceAll(err.Error(), "\n", " | "))
		return 1
	}
	return 0
}

// options is what one run measures.
type options struct {
	rounds     int
	slice      time.Duration // per round, case, size and transport
	warm       time.Duration // per case, size and transport, before the rounds
	unarySizes []int
	bidiSizes  []int
	callSizes  []int // the calls case: unary calls from callers goroutines at once
	callers    int
	httpSizes  []int
	clients    []int
	idle       int
	cases      []string
}

var allCases = []string{"unary", "calls", "bidi", "http", "idle"}

// run parses args and measures; the records go to -records.
func run(ctx context.Context, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var o options
	fs.IntVar(&o.rounds, "rounds", 5, "interleaved rounds")
	fs.DurationVar(&o.slice, "slice", time.Second, "time per round of each case, size and transport")
	fs.DurationVar(&o.warm, "warm", 200*time.Millisecond, "warm-up of each case, size and transport")
	unary := fs.String("unary", "64,4096,65536,1048576", "gRPC unary payload `SIZES`")
	calls := fs.String("calls", "64,65536", "gRPC unary payload `SIZES` of the calls case, made from -callers goroutines at once over one connection")
	fs.IntVar(&o.callers, "callers", 16, "the calls case's concurrent callers")
	bidi := fs.String("bidi", "64,65536", "gRPC bidirectional stream message `SIZES`")
	httpSizes := fs.String("http", "1024,1048576", "net/http body `SIZES`")
	clients := fs.String("clients", "1,16", "net/http concurrent clients, a `LIST`")
	fs.IntVar(&o.idle, "idle", 10000, "idle connections (fewer if RLIMIT_NOFILE is lower; 0: none)")
	cases := fs.String("cases", strings.Join(allCases, ","), "cases to run, a `LIST` of "+strings.Join(allCases, ", "))
	recPath := fs.String("records", "", "write the records to `FILE` (default standard output)")
	spin := fs.Duration("spin", 0, "sandirect's adaptive wait Spin in both processes (0: the default Config); longer than the default spins politely through long waits (docs/performance.md, \"A polite spin\")")
	prof := fs.String("cpuprofile", "", "write CPU profiles of the client, `PREFIX`.client.pprof, and of the gRPC and net/http server, PREFIX.server.pprof (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	for _, l := range []struct {
		s   string
		dst *[]int
	}{{*unary, &o.unarySizes}, {*calls, &o.callSizes}, {*bidi, &o.bidiSizes}, {*httpSizes, &o.httpSizes}, {*clients, &o.clients}} {
		if *l.dst, err = parseInts(l.s); err != nil {
			return err
		}
	}
	for c := range strings.SplitSeq(*cases, ",") {
		if c = strings.TrimSpace(c); c != "" && !slices.Contains(allCases, c) {
			return fmt.Errorf("unknown case %q (have %s)", c, strings.Join(allCases, ", "))
		}
		o.cases = append(o.cases, strings.TrimSpace(c))
	}
	if o.rounds < 1 || o.slice <= 0 || o.warm < 0 || o.idle < 0 || o.callers < 1 {
		return fmt.Errorf("bad plan: -rounds %d, -slice %v, -warm %v, -idle %d, -callers %d", o.rounds, o.slice, o.warm, o.idle, o.callers)
	}
	out := stdout
	if *recPath != "" {
		f, err := os.OpenFile(*recPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	if *spin < 0 {
		return fmt.Errorf("bad plan: -spin %v", *spin)
	}
	if *spin > 0 {
		// The server process inherits it (startServer).
		os.Setenv(envSpin, spin.String())
		defer os.Unsetenv(envSpin)
	} else {
		os.Unsetenv(envSpin) // the default Config, whatever the caller's environment says
	}
	if *prof != "" {
		stop, err := startProfile(*prof + ".client.pprof")
		if err != nil {
			return err
		}
		defer stop()
		// The server process inherits it (startServer).
		os.Setenv(envProfile, *prof+".server.pprof")
		defer os.Unsetenv(envProfile)
	}
	w := &rowWriter{w: out}
	if err := measure(ctx, w, o); err != nil {
		return err
	}
	if len(w.failed) > 0 {
		return fmt.Errorf("%d measurements failed: %w", len(w.failed), errors.Join(w.failed...))
	}
	return nil
}

// startProfile starts a CPU profile into path; stop ends and writes it.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad size or count %q: want a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// measure runs the chosen cases in order, the idle one last.
func measure(ctx context.Context, w *rowWriter, o options) error {
	if slices.ContainsFunc(o.cases, func(c string) bool { return c != "idle" }) {
		srv, err := startServer(ctx)
		if err != nil {
			return err
		}
		err = measureServed(ctx, w, o, srv)
		if cerr := srv.stop(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	if slices.Contains(o.cases, "idle") && o.idle > 0 {
		for _, t := range idleTransports {
			if err := measureIdle(ctx, w, o.idle, t); err != nil {
				if err := w.fail(ctx, fmt.Errorf("idle %s: %w", t, err)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func measureServed(ctx context.Context, w *rowWriter, o options, srv *server) error {
	if slices.Contains(o.cases, "unary") || slices.Contains(o.cases, "calls") || slices.Contains(o.cases, "bidi") {
		g, err := newGRPCClients(srv.addrs)
		if err != nil {
			return err
		}
		defer g.close()
		if slices.Contains(o.cases, "unary") {
			if err := measureUnary(ctx, w, o, g); err != nil {
				return err
			}
		}
		if slices.Contains(o.cases, "calls") {
			if err := measureCalls(ctx, w, o, g); err != nil {
				return err
			}
		}
		if slices.Contains(o.cases, "bidi") {
			if err := measureBidi(ctx, w, o, g); err != nil {
				return err
			}
		}
	}
	if slices.Contains(o.cases, "http") {
		h := newHTTPClients(srv.addrs)
		defer h.close()
		if err := measureHTTP(ctx, w, o, h); err != nil {
			return err
		}
	}
	return nil
}

// measureRate interleaves the transports' rate measurements of one case
// and size (rate: operations a second over t for d), and writes a row for
// each transport that did not fail, named kind/transport.
func measureRate(ctx context.Context, w *rowWriter, o options, cas, kind string, size int,
	rate func(t transport, d time.Duration) (float64, error)) error {
	rates := map[string][]float64{}
	failed := map[string]bool{}
	step := func(t transport, d time.Duration, keep bool) error {
		if failed[t.name] {
			return nil
		}
		r, err := rate(t, d)
		if err != nil {
			failed[t.name] = true
			return w.fail(ctx, fmt.Errorf("%s %d B over %s: %w", cas, size, t.name, err))
		}
		if keep {
			rates[t.name] = append(rates[t.name], r)
		}
		return nil
	}
	if err := interleave(o, step); err != nil {
		return err
	}
	for _, t := range transports {
		if !failed[t.name] {
			if err := w.row(rateRow(cas, kind+"/"+t.name, size, rates[t.name], size)); err != nil {
				return err
			}
		}
	}
	return nil
}

// interleave runs step for every transport: a warm-up of o.warm each,
// then o.rounds rounds of o.slice each, the transports' order rotating.
// keep is false for the warm-up.
func interleave(o options, step func(t transport, d time.Duration, keep bool) error) error {
	for _, t := range transports {
		if err := step(t, o.warm, false); err != nil {
			return err
		}
	}
	for r := range o.rounds {
		for _, t := range rotated(transports, r) {
			if err := step(t, o.slice, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// rotated is the transports' order in round r: each goes first in turn.
func rotated[T any](ts []T, r int) []T {
	k := r % len(ts)
	return append(slices.Clone(ts[k:]), ts[:k]...)
}

// ---- rows ----

// rowWriter writes one row's records as a JSON array a line, and keeps
// the failures of measurements that the run went on without.
type rowWriter struct {
	w      io.Writer
	failed []error
}

// fail notes a failed measurement and lets the run go on, unless the run
// itself was cancelled.
func (rw *rowWriter) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	rw.failed = append(rw.failed, err)
	return rw.note("FAILED %v", err)
}

func (rw *rowWriter) row(recs []Record) error {
	b, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	_, err = rw.w.Write(append(b, '\n'))
	return err
}

func (rw *rowWriter) note(format string, args ...any) error {
	_, err := fmt.Fprintf(rw.w, "# "+format+"\n", args...)
	return err
}

// latencyRow summarizes per-call latencies.
func latencyRow(cas, transport string, size int, samples []time.Duration) []Record {
	slices.Sort(samples)
	q := func(p float64) float64 {
		i := min(len(samples)-1, int(p*float64(len(samples))))
		return float64(samples[i].Nanoseconds())
	}
	rec := func(m string, v float64) Record {
		return Record{Suite: suiteName, Case: cas, Transport: transport, Size: size, Metric: m, Value: v}
	}
	return []Record{rec(metricLatMin, q(0)), rec(metricLatP50, q(0.5)), rec(metricLatP99, q(0.99)),
		rec(metricLatP999, q(0.999))}
}

// rateRow summarizes rounds of a throughput: ops per second in each, with
// bytes bytes per op; the median round and the range.
func rateRow(cas, transport string, size int, opsPerSec []float64, bytes int) []Record {
	sort.Float64s(opsPerSec)
	med := opsPerSec[len(opsPerSec)/2]
	if len(opsPerSec)%2 == 0 {
		med = (opsPerSec[len(opsPerSec)/2-1] + opsPerSec[len(opsPerSec)/2]) / 2
	}
	gb := func(ops float64) float64 { return ops * float64(bytes) / 1e9 }
	rec := func(m string, v float64) Record {
		return Record{Suite: suiteName, Case: cas, Transport: transport, Size: size, Metric: m, Value: v}
	}
	out := []Record{rec(metricBW, gb(med))}
	if len(opsPerSec) > 1 {
		out = append(out, rec(metricBWMin, gb(opsPerSec[0])), rec(metricBWMax, gb(opsPerSec[len(opsPerSec)-1])))
	}
	return append(out, rec(metricRate, med/1e6))
}
