package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

func main() {
	if role := os.Getenv(envPeer); role != "" {
		os.Exit(peerMain(role))
	}
	if addr := os.Getenv(envFirstDial); addr != "" {
		os.Exit(firstDialMain(addr)) // suite setup: a fresh process's first dial
	}
	if isTerminal(os.Stderr) {
		progressTerm = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", oneLine(err))
		os.Exit(1)
	}
}

// oneLine folds a multi-line error (peer stderr) into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " | ")), " ")
}

// progressTerm, when set (by main, if stderr is a terminal), shows a
// progress bar while the suites run.
var progressTerm io.Writer

// run parses args, runs the chosen suites and writes the tables to stdout.
func run(ctx context.Context, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stdout)
	quick := fs.Bool("quick", envBool("SANDIRECT_BENCH_QUICK"), "fewer sizes and shorter runs (env SANDIRECT_BENCH_QUICK)")
	jsonPath := fs.String("json", os.Getenv("SANDIRECT_BENCH_JSON"), "write every number to `FILE` as a JSON array of records (env SANDIRECT_BENCH_JSON)")
	pin := fs.Bool("pin", !envFalse("SANDIRECT_BENCH_PIN"), "pin the measuring threads of the two processes to two different CPUs (env SANDIRECT_BENCH_PIN)")
	outDir := fs.String("out", envOr("SANDIRECT_BENCH_OUT", "sandirect-report"),
		"write the report to `DIR` (created; files overwritten): bench.json, the same records as -json, and per suite\n"+
			"a plot of latency and bandwidth against message size, SUITE.svg and SUITE.png; empty: no report (env SANDIRECT_BENCH_OUT)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: bench [flags] [SUITE...]\n\nsuites:\n")
		for _, s := range suites {
			fmt.Fprintf(fs.Output(), "  %-8s %s\n", s.Name, s.Doc)
		}
		fmt.Fprintf(fs.Output(), "\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	chosen, err := chooseSuites(fs.Args())
	if err != nil {
		return err
	}

	env, err := newEnv(ctx, stdout, *quick, *pin)
	if err != nil {
		return err
	}
	hw := hardware()
	fmt.Fprintf(stdout, "# sandirect bench on %s\n# %s\n", hw, env.describe())
	if progressTerm != nil {
		total := 0
		for _, s := range chosen {
			if s.Rows != nil {
				total += s.Rows(env)
			}
		}
		env.progress = newProgressBar(progressTerm, total)
		env.out = env.progress.writer(stdout)
	}
	var all []Record
	var runErr error
	for _, s := range chosen {
		printSuiteHeader(env.out, s.Name)
		env.suite = s.Name
		recs, err := s.Run(ctx, env)
		all = append(all, recs...)
		if err != nil {
			runErr = fmt.Errorf("suite %s: %w", s.Name, err)
			break
		}
	}
	if env.progress != nil {
		env.progress.stop()
	}
	printSideBySide(stdout, all)
	printAppSideBySide(stdout, all)
	printSetupSideBySide(stdout, all)
	if runErr == nil {
		printTargets(stdout, all, env.preempts)
	}
	// Also after a failure: what was measured is kept.
	if *jsonPath != "" {
		if err := writeJSON(*jsonPath, all); err != nil && runErr == nil {
			runErr = err
		}
	}
	if *outDir != "" {
		mode := "full run"
		if *quick {
			mode = "quick run"
		}
		line := fmt.Sprintf("%s at the start, %s at the end; %s, %s", hw, loadAvg(), mode, time.Now().Format("2006-01-02 15:04"))
		paths, err := writeReport(*outDir, all, line)
		if len(paths) > 0 {
			fmt.Fprintf(stdout, "\nreport:\n")
			for _, p := range paths {
				fmt.Fprintf(stdout, "  %s\n", p)
			}
		}
		switch {
		case errors.Is(err, errModuleSkipped): // bench.json is there; the figures could not be drawn here
			fmt.Fprintf(stdout, "  no figures: %s\n", oneLine(err))
		case err != nil && runErr == nil:
			runErr = fmt.Errorf("report: %w", err)
		}
	}
	return runErr
}

// writeReport writes bench.json and the suites' figures into dir and
// returns the paths written. An error matching errModuleSkipped says that
// only bench.json could be written (see plotReport).
func writeReport(dir string, recs []Record, hardware string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	p := filepath.Join(dir, "bench.json")
	if err := writeJSON(p, recs); err != nil {
		return nil, err
	}
	paths = append(paths, p)
	figs, err := plotReport(context.Background(), dir, recs, hardware)
	return append(paths, figs...), err
}

// hardware names the machine: CPU model, CPUs, kernel, load.
func hardware() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs, Linux %s, %s, load %s", model, runtime.NumCPU(), sys.KernelRelease(),
		runtime.Version(), loadAvg())
}

// loadAvg is the 1-minute load average.
func loadAvg() string {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 1 {
			return f[0]
		}
	}
	return "?"
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func chooseSuites(names []string) ([]*Suite, error) {
	if len(names) == 0 {
		return suites, nil
	}
	var out []*Suite
	for _, n := range names {
		s := lookupSuite(n)
		if s == nil {
			var known []string
			for _, s := range suites {
				known = append(known, s.Name)
			}
			return nil, fmt.Errorf("unknown suite %q (have %s)", n, strings.Join(known, ", "))
		}
		out = append(out, s)
	}
	return out, nil
}

func envBool(name string) bool {
	switch strings.ToLower(os.Getenv(name)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

func envFalse(name string) bool {
	switch strings.ToLower(os.Getenv(name)) {
	case "0", "false", "no", "off":
		return true
	}
	return false
}
