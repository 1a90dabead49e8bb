package main

// The app suite: what a Go application gets. gRPC-go unary calls, one at
// a time and from 16 goroutines at once over one connection (case
// unary-c16, calls per second), and a bidirectional stream, net/http
// keep-alive GETs, each over sandirect with
// the default Config (transports grpc/sandirect, http/sandirect), a Unix
// socket (grpc/unix, http/unix) and TCP loopback (grpc/tcp, http/tcp),
// interleaved round by round; and the OS threads of a server whose idle
// connections each have a goroutine waiting in Read (case idle:
// sockets/default, unix, tcp). Both processes run unpinned, as Go
// programs do. The measurements are made by bench/app, a
// module of its own so that gRPC stays out of sandirect's go.mod: this
// file builds it, runs it with the plan's rounds and sizes, and merges the
// records it writes (see bench/app/main.go for the cases).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const appRunMax = 20 * time.Minute

// Metrics of the idle case.
const (
	appMetricConns   = "conns"       // connections held
	appMetricThreads = "threads"     // the server's OS threads with a Read waiting on each
	appMetricProcs   = "gomaxprocs"  // the server's GOMAXPROCS
	appMetricWake    = "wake_all_ns" // a byte to every connection, every echo back
)

// appIdleTransport names the idle row of ours.
const appIdleTransport = "sockets/default"

var (
	appTransports  = []string{"sandirect", "unix", "tcp"}
	appUnarySizes  = []int{64, 4 * kiB, 64 * kiB, miB}
	appCallSizes   = []int{64, 64 * kiB}
	appCallers     = 16
	appBidiSizes   = []int{64, 64 * kiB}
	appHTTPSizes   = []int{kiB, miB}
	appHTTPClients = []int{1, 16}
)

func init() {
	register(&Suite{
		Name: "app",
		Doc:  "gRPC-go unary and streams, net/http GETs, idle connections' threads: sandirect (default Config) vs unix, tcp",
		Run:  runApp,
		Rows: appRows,
	})
	plotTitles["app"] = plotMeta{
		LatencyTitle: "gRPC unary call, median (bars: min to p99)", LatencyLabel: "per call",
		BandwidthTitle: "gRPC unary -cN: N callers, bidi stream, net/http GET -cN: N clients (bars: rounds)", BandwidthLabel: "payload GB/s",
	}
	// Issue 18's targets.
	for _, s := range []struct {
		size  int
		limit float64
	}{{64, 0.7}, {4 * kiB, 0.7}, {64 * kiB, 0.7}, {miB, 0.9}} {
		targets = append(targets, target{name: fmt.Sprintf("app grpc unary %s p50 / unix (interleaved)", fsize(s.size)),
			num: recordKey{"app", "unary", "grpc/sandirect", s.size, metricLatP50},
			den: recordKey{"app", "unary", "grpc/unix", s.size, metricLatP50}, limit: s.limit, atMost: true})
	}
	for _, c := range []struct {
		clients int
		limit   float64
	}{{1, 1.3}, {16, 1.0}} {
		for _, size := range appHTTPSizes {
			cas := "get-c" + strconv.Itoa(c.clients)
			targets = append(targets, target{name: fmt.Sprintf("app http %s %d client(s) req/s / unix", fsize(size), c.clients),
				num: recordKey{"app", cas, "http/sandirect", size, metricRate},
				den: recordKey{"app", cas, "http/unix", size, metricRate}, limit: c.limit})
		}
	}
	goals = append(goals, goal{name: "app idle conns: server threads - GOMAXPROCS",
		key:   recordKey{"app", "idle", appIdleTransport, 0, appMetricThreads},
		minus: &recordKey{"app", "idle", appIdleTransport, 0, appMetricProcs}, unit: 1, limit: 20, atMost: true})
}

// appPlan is the app suite's share of the plan.
type appPlan struct {
	rounds    int
	slice     time.Duration
	warm      time.Duration
	unary     []int
	calls     []int // unary calls from callers goroutines at once
	callers   int
	bidi      []int
	httpSizes []int
	clients   []int
	idle      int
}

func appPlanOf(env *Env) appPlan {
	p := appPlan{rounds: 5, slice: time.Second, warm: 200 * time.Millisecond, unary: appUnarySizes,
		calls: appCallSizes, callers: appCallers, bidi: appBidiSizes, httpSizes: appHTTPSizes, clients: appHTTPClients, idle: 10000}
	switch {
	case testTiny:
		p = appPlan{rounds: 2, slice: 5 * time.Millisecond, warm: time.Millisecond, unary: []int{64, 64 * kiB},
			calls: []int{64}, callers: 4, bidi: []int{64}, httpSizes: []int{kiB}, clients: []int{1, 4}, idle: 32}
	case env.quick:
		p.rounds, p.slice, p.warm = 3, 150*time.Millisecond, 50*time.Millisecond
	}
	return p
}

func appRows(env *Env) int {
	p := appPlanOf(env)
	return len(appTransports)*(len(p.unary)+len(p.calls)+len(p.bidi)+len(p.httpSizes)*len(p.clients)) + len(appTransports)
}

// runApp builds bench/app and merges its rows. A module that cannot be
// built is reported and skipped; a failing run is an error.
func runApp(ctx context.Context, env *Env) ([]Record, error) {
	tmp, err := os.MkdirTemp("", "sandirect-app-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin, err := appModule.build(ctx, tmp)
	if err != nil {
		if errors.Is(err, errModuleSkipped) {
			fmt.Fprintf(env.out, "%-9s %-18s %s\n", "", "app", oneLine(err))
			for range appRows(env) {
				env.step("app skipped")
			}
			return nil, nil
		}
		return nil, err
	}
	fmt.Fprintf(env.out, "%-9s %-18s latency: per call (a whole round trip); Mmsg/s: calls, echoes or requests /s / 1e6\n", "", "note:")
	p := appPlanOf(env)
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, appRunMax)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-rounds", strconv.Itoa(p.rounds), "-slice", p.slice.String(),
		"-warm", p.warm.String(), "-unary", intList(p.unary), "-calls", intList(p.calls), "-callers", strconv.Itoa(p.callers),
		"-bidi", intList(p.bidi), "-http", intList(p.httpSizes),
		"-clients", intList(p.clients), "-idle", strconv.Itoa(p.idle), "-records", "/dev/fd/3")
	cmd.ExtraFiles = []*os.File{w}
	out := &tailBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		w.Close()
		return nil, fmt.Errorf("app: %w", err)
	}
	w.Close()
	recs, perr := appMerge(env, r)
	if perr != nil {
		cmd.Process.Kill()
	}
	werr := cmd.Wait()
	switch {
	case perr != nil:
		return recs, perr
	case werr != nil:
		return recs, fmt.Errorf("app: %w; its output: %s", werr, lastLines(out.String(), 5))
	}
	return recs, nil
}

// appMerge reads bench/app's rows from r and reports each.
func appMerge(env *Env, r io.Reader) ([]Record, error) {
	var recs []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) > 0 && line[0] == '#' {
			fmt.Fprintf(env.out, "%-9s %-18s note: %s\n", "", "app", strings.TrimSpace(string(line[1:])))
			continue
		}
		var row []Record
		if err := json.Unmarshal(line, &row); err != nil {
			return recs, fmt.Errorf("app: bad record line %q: %w", line, err)
		}
		if len(row) > 0 && row[0].Case == "idle" {
			rs, err := appIdleRow(env, row)
			if err != nil {
				return recs, err
			}
			recs = append(recs, rs...)
			continue
		}
		res, err := appResult(row)
		if err != nil {
			return recs, err
		}
		recs = append(recs, env.Report(res)...)
	}
	return recs, sc.Err()
}

// appResult turns one row's records back into a Result.
func appResult(row []Record) (Result, error) {
	if len(row) == 0 {
		return Result{}, errors.New("app: empty row")
	}
	res := Result{Case: row[0].Case, Transport: row[0].Transport, Size: row[0].Size, Preempted: -1}
	m := map[string]float64{}
	for _, r := range row {
		if r.Suite != "app" || r.Case != res.Case || r.Size != res.Size || r.Transport != res.Transport {
			return Result{}, fmt.Errorf("app: row mixes %+v and %+v", row[0], r)
		}
		m[r.Metric] = r.Value
	}
	kind, _, _ := strings.Cut(res.Transport, "/")
	switch {
	case res.Case == "unary" && kind == "grpc":
		res.Lat = &Latency{Min: m[metricLatMin], P50: m[metricLatP50], P99: m[metricLatP99], P999: m[metricLatP999]}
	case ((res.Case == "bidi" || strings.HasPrefix(res.Case, "unary-c")) && kind == "grpc") ||
		(strings.HasPrefix(res.Case, "get-c") && kind == "http"):
		res.HasBW = true
		res.BW, res.BWMin, res.BWMax, res.Rate = m[metricBW], m[metricBWMin], m[metricBWMax], m[metricRate]
	default:
		return Result{}, fmt.Errorf("app: unexpected record %+v", row[0])
	}
	return res, nil
}

// appIdleRow prints an idle row and returns its records.
func appIdleRow(env *Env, row []Record) ([]Record, error) {
	m := map[string]float64{}
	for _, r := range row {
		if r.Suite != "app" || r.Case != "idle" || r.Transport != row[0].Transport {
			return nil, fmt.Errorf("app: row mixes %+v and %+v", row[0], r)
		}
		m[r.Metric] = r.Value
	}
	for _, k := range []string{appMetricConns, appMetricThreads, appMetricProcs, appMetricWake} {
		if _, ok := m[k]; !ok {
			return nil, fmt.Errorf("app: idle row of %s lacks %s", row[0].Transport, k)
		}
	}
	fmt.Fprintf(env.out, "%-9s %-18s %6s %.0f idle connections with a Read waiting: server threads %.0f (GOMAXPROCS %.0f); all woken in %s ms\n",
		"idle", row[0].Transport, "", m[appMetricConns], m[appMetricThreads], m[appMetricProcs], fnum(m[appMetricWake]/1e6))
	env.step("idle " + row[0].Transport)
	return row, nil
}

// printAppSideBySide prints the app suite's headline numbers, one row per
// transport, each with its ratio to the Unix socket's: gRPC unary p50 per
// call, concurrent calls and bidi echoes per second, then net/http
// requests per second, then the idle threads. Nothing without app records.
func printAppSideBySide(w io.Writer, recs []Record) {
	get := func(cas, transport string, size int, metric string) (float64, bool) {
		for _, r := range recs {
			if r.Suite == "app" && r.Case == cas && r.Transport == transport && r.Size == size && r.Metric == metric {
				return r.Value, true
			}
		}
		return 0, false
	}
	printed := false
	for _, kind := range []string{"grpc", "http"} {
		cols := appColumns(recs, kind)
		if len(cols) == 0 {
			continue
		}
		if !printed {
			fmt.Fprintf(w, "\n--- side by side: app (ratio to unix) %s\n", strings.Repeat("-", 51))
			printed = true
		}
		const cell = "%-16s"
		fmt.Fprintf(w, "%-16s", kind)
		for _, c := range cols {
			fmt.Fprintf(w, cell, c.head)
		}
		fmt.Fprintln(w)
		for _, t := range appTransports {
			fmt.Fprintf(w, "%-16s", kind+"/"+t)
			for _, c := range cols {
				v, ok := get(c.cas, kind+"/"+t, c.size, c.metric)
				u, uok := get(c.cas, kind+"/unix", c.size, c.metric)
				s := "-"
				if ok {
					s = f3(v * c.scale)
					if uok && u > 0 && t != "unix" {
						s += fmt.Sprintf(" (%.2f)", v/u)
					}
				}
				fmt.Fprintf(w, cell, s)
			}
			fmt.Fprintln(w)
		}
	}
	var idle []string
	for _, t := range []string{appIdleTransport, "unix", "tcp"} {
		th, ok1 := get("idle", t, 0, appMetricThreads)
		n, ok2 := get("idle", t, 0, appMetricConns)
		if ok1 && ok2 {
			idle = append(idle, fmt.Sprintf("%s %.0f", t, th))
			if t == appIdleTransport {
				procs, _ := get("idle", t, 0, appMetricProcs)
				idle[0] = fmt.Sprintf("%.0f connections with a Read waiting, server threads (GOMAXPROCS %.0f): %s", n, procs, idle[0])
			}
		}
	}
	if len(idle) > 0 {
		fmt.Fprintf(w, "idle: %s\n", strings.Join(idle, ", "))
	}
}

// appCol is one column of the app suite's side-by-side table.
type appCol struct {
	cas    string
	size   int
	metric string
	scale  float64 // to the unit of head
	head   string
}

// appColumns are the columns of kind (grpc, http) in the order measured.
func appColumns(recs []Record, kind string) []appCol {
	var cols []appCol
	for _, r := range recs {
		k, _, _ := strings.Cut(r.Transport, "/")
		if r.Suite != "app" || k != kind || (r.Metric != metricLatP50 && r.Metric != metricRate) {
			continue
		}
		c := appCol{cas: r.Case, size: r.Size, metric: r.Metric, scale: 1e6}
		switch {
		case r.Case == "unary":
			c.scale, c.head = 1e-3, "unary "+fsize(r.Size)+" µs"
		case r.Case == "bidi":
			c.head = "bidi " + fsize(r.Size) + "/s"
		case strings.HasPrefix(r.Case, "unary-c"):
			c.head = strings.TrimPrefix(r.Case, "unary-") + " " + fsize(r.Size) + "/s"
		default:
			c.head = strings.TrimPrefix(r.Case, "get-") + " " + fsize(r.Size) + " req/s"
		}
		if !slices.ContainsFunc(cols, func(o appCol) bool { return o.head == c.head }) {
			cols = append(cols, c)
		}
	}
	return cols
}
