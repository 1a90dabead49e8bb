package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	if role := os.Getenv(envPeer); role != "" {
		os.Exit(peerMain(role))
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

// run parses args, runs the chosen suites and writes the tables to stdout.
func run(ctx context.Context, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stdout)
	quick := fs.Bool("quick", envBool("SANDIRECT_BENCH_QUICK"), "fewer sizes and shorter runs (env SANDIRECT_BENCH_QUICK)")
	jsonPath := fs.String("json", os.Getenv("SANDIRECT_BENCH_JSON"), "write every number to `FILE` as a JSON array of records (env SANDIRECT_BENCH_JSON)")
	pin := fs.Bool("pin", !envFalse("SANDIRECT_BENCH_PIN"), "pin the measuring threads of the two processes to two different CPUs (env SANDIRECT_BENCH_PIN)")
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
	fmt.Fprintf(stdout, "# sandirect bench: %s\n", env.describe())
	var all []Record
	var runErr error
	for _, s := range chosen {
		printSuiteHeader(stdout, s.Name)
		env.suite = s.Name
		recs, err := s.Run(ctx, env)
		all = append(all, recs...)
		if err != nil {
			runErr = fmt.Errorf("suite %s: %w", s.Name, err)
			break
		}
	}
	if runErr == nil {
		printTargets(stdout, all, env.preempts)
	}
	if *jsonPath != "" {
		// Also after a failure: what was measured is kept.
		if err := writeJSON(*jsonPath, all); err != nil && runErr == nil {
			runErr = err
		}
	}
	return runErr
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
