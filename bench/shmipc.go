package main

// cloudwego/shmipc-go as a peer of the conn suite. It lives in a module of
// its own, bench/shmipc, so that neither it nor its dependencies enter
// sandirect's go.mod: the conn suite builds that module with the go
// command, runs the binary with the plan's sizes and times, and merges the
// records it writes (our schema, transport "shmipc") into its own table.
// Where the module cannot be found or built (no go command, no network for
// its first download), the suite says why and goes on without it.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	envShmipc      = "SANDIRECT_BENCH_SHMIPC" // the module's directory; "0": leave shmipc out
	shmipcBuildMax = 5 * time.Minute          // a first build downloads shmipc-go
	shmipcRunMax   = 10 * time.Minute
)

// errShmipcSkipped says that shmipc could not be measured here, and why.
var errShmipcSkipped = errors.New("shmipc skipped")

// shmipcDir finds the bench/shmipc module: $SANDIRECT_BENCH_SHMIPC, else
// bench/shmipc in the current directory or one above it (go run ./bench
// from the repository, go test in bench/), else next to this source file
// as it was compiled.
func shmipcDir() (string, error) {
	if d := os.Getenv(envShmipc); d != "" {
		if d == "0" {
			return "", fmt.Errorf("%w: %s=0", errShmipcSkipped, envShmipc)
		}
		return d, nil
	}
	var tried []string
	try := func(d string) bool {
		tried = append(tried, d)
		_, err := os.Stat(filepath.Join(d, "go.mod"))
		return err == nil
	}
	if wd, err := os.Getwd(); err == nil {
		for _, d := range []string{filepath.Join(wd, "bench", "shmipc"), filepath.Join(wd, "shmipc"),
			filepath.Join(wd, "..", "bench", "shmipc")} {
			if try(d) {
				return d, nil
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		if d := filepath.Join(filepath.Dir(file), "shmipc"); try(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w: module bench/shmipc not found (tried %s; set %s)", errShmipcSkipped,
		strings.Join(tried, ", "), envShmipc)
}

func goCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	p := filepath.Join(cmp.Or(os.Getenv("GOROOT"), "/usr/local/go"), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: no go command in PATH or GOROOT", errShmipcSkipped)
	}
	return p, nil
}

// buildShmipc builds the module's binary into dir.
func buildShmipc(ctx context.Context, dir string) (string, error) {
	src, err := shmipcDir()
	if err != nil {
		return "", err
	}
	goCmd, err := goCommand()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "shmipc-bench")
	ctx, cancel := context.WithTimeout(ctx, shmipcBuildMax)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil && ctx.Err() != context.Canceled {
			err = ctx.Err()
		}
		return "", fmt.Errorf("%w: go build in %s: %v: %s", errShmipcSkipped, src, err, lastLines(string(out), 3))
	}
	return bin, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

func intList(ns []int) string {
	var s []string
	for _, n := range ns {
		s = append(s, strconv.Itoa(n))
	}
	return strings.Join(s, ",")
}

// runShmipc measures shmipc-go with the conn suite's plan. A module that
// cannot be built is reported and skipped; a failing run is an error.
func runShmipc(ctx context.Context, env *Env) (recs []Record, err error) {
	tmp, err := os.MkdirTemp("", "sandirect-shmipc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	ping, stream := connSizes(env)
	bin, err := buildShmipc(ctx, tmp)
	if err != nil {
		if errors.Is(err, errShmipcSkipped) {
			fmt.Fprintf(env.out, "%-9s %-13s %s\n", "", "shmipc", oneLine(err))
			for range len(ping) + len(stream) {
				env.step("shmipc skipped")
			}
			return nil, nil
		}
		return nil, err
	}

	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, shmipcRunMax)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"-ping", intList(ping), "-stream", intList(stream),
		"-lat-time", env.plan.blockTime.String(), "-lat-max", strconv.Itoa(env.plan.blockMax),
		"-warm", strconv.Itoa(env.plan.blockWarm),
		"-bw-time", env.plan.bwTime.String(), "-chunks", strconv.Itoa(max(1, env.plan.bwChunks)),
		"-records", "/dev/fd/3")
	cmd.ExtraFiles = []*os.File{w}
	out := &tailBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = out, out // shmipc-go logs to both
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		w.Close()
		return nil, fmt.Errorf("shmipc: %w", err)
	}
	w.Close()

	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var parseErr error
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) > 0 && line[0] == '#' {
			fmt.Fprintf(env.out, "%-9s %-13s note: %s\n", "", "shmipc", strings.TrimSpace(string(line[1:])))
			continue
		}
		var row []Record
		if err := json.Unmarshal(line, &row); err != nil {
			parseErr = fmt.Errorf("shmipc: bad record line %q: %w", line, err)
			break
		}
		res, err := shmipcResult(row)
		if err != nil {
			parseErr = err
			break
		}
		recs = append(recs, env.Report(res)...)
	}
	if parseErr != nil {
		cmd.Process.Kill()
	}
	werr := cmd.Wait()
	switch {
	case parseErr != nil:
		return recs, parseErr
	case werr != nil:
		return recs, fmt.Errorf("shmipc: %w; its output: %s", werr, lastLines(out.String(), 5))
	}
	return recs, nil
}

// shmipcResult turns one row's records back into a Result.
func shmipcResult(row []Record) (Result, error) {
	if len(row) == 0 {
		return Result{}, errors.New("shmipc: empty row")
	}
	res := Result{Case: row[0].Case, Transport: row[0].Transport, Size: row[0].Size, Preempted: -1}
	if res.Transport != "shmipc" || (res.Case != "pingpong" && res.Case != "stream") {
		return Result{}, fmt.Errorf("shmipc: unexpected record %+v", row[0])
	}
	m := map[string]float64{}
	for _, r := range row {
		if r.Case != res.Case || r.Size != res.Size || r.Transport != res.Transport {
			return Result{}, fmt.Errorf("shmipc: row mixes %+v and %+v", row[0], r)
		}
		m[r.Metric] = r.Value
	}
	if res.Case == "pingpong" {
		res.Lat = &Latency{Min: m[metricLatMin], P50: m[metricLatP50], P99: m[metricLatP99], P999: m[metricLatP999]}
	} else {
		res.HasBW = true
		res.BW, res.BWMin, res.BWMax, res.Rate = m[metricBW], m[metricBWMin], m[metricBWMax], m[metricRate]
	}
	return res, nil
}
