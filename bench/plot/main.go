// Command plot draws sandirect's benchmark report: one figure per suite,
// SUITE.svg and SUITE.png, from the records the bench measured. It is a
// module of its own so that gonum/plot and its fonts, LaTeX and PDF
// packages stay out of sandirect's go.mod; the bench builds and runs it
// when it writes a report (-out), and it can be run by hand on a report
// the bench wrote:
//
//	go -C bench/plot run . -in REQUEST.json -out DIR
//
// The request is one JSON object (see request): the hardware line for the
// titles, each suite's one-line doc and optional panel titles, the
// transports that are interleaved references rather than rows of their
// own, and the records in the bench's schema. The paths written are printed
// one a line on standard output, in the order of the suites' first records.
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
	"slices"
	"strings"
	"syscall"
)

// Record is one number, in the bench's schema (bench/suite.go).
type Record struct {
	Suite     string  `json:"suite"`
	Case      string  `json:"case"`
	Transport string  `json:"transport"`
	Size      int     `json:"size"`
	Metric    string  `json:"metric"`
	Value     float64 `json:"value"`
}

// Metric names, as in the bench.
const (
	metricLatMin = "lat_min_ns"
	metricLatP50 = "lat_p50_ns"
	metricLatP99 = "lat_p99_ns"
	metricBW     = "bw_gbps"
	metricBWMin  = "bw_min_gbps"
	metricBWMax  = "bw_max_gbps"
)

const (
	kiB = 1 << 10
	miB = 1 << 20
)

// request is what the bench sends.
type request struct {
	Hardware   string      `json:"hardware"`   // second line of every title
	Suites     []suiteMeta `json:"suites"`     // docs and titles; a suite without one is plotted all the same
	References []string    `json:"references"` // interleaved references: not drawn as rows of a suite
	Records    []Record    `json:"records"`
}

// suiteMeta says how to title one suite's figure; empty fields keep the
// defaults.
type suiteMeta struct {
	Name           string `json:"name"`
	Doc            string `json:"doc"`
	LatencyTitle   string `json:"latency_title,omitempty"`
	LatencyLabel   string `json:"latency_label,omitempty"`
	BandwidthTitle string `json:"bandwidth_title,omitempty"`
	BandwidthLabel string `json:"bandwidth_label,omitempty"`
}

func (r *request) suite(name string) suiteMeta {
	for _, s := range r.Suites {
		if s.Name == name {
			return s
		}
	}
	return suiteMeta{Name: name}
}

func (r *request) isReference(transport string) bool { return slices.Contains(r.References, transport) }

// relabel gives kind the suite's own titles, where it has them.
func (m suiteMeta) relabel(kind panelKind) panelKind {
	title, label := m.LatencyTitle, m.LatencyLabel
	if kind.metric == metricBW {
		title, label = m.BandwidthTitle, m.BandwidthLabel
	}
	if title != "" {
		kind.title = title
	}
	if label != "" {
		kind.yLabel = label
	}
	return kind
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdin, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", strings.ReplaceAll(err.Error(), "\n", " | "))
		os.Exit(1)
	}
}

// run reads the request (-in, or stdin) and writes the figures into -out.
func run(ctx context.Context, stdin io.Reader, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	fs.SetOutput(stdout)
	in := fs.String("in", "", "read the request from `FILE` (default: standard input)")
	out := fs.String("out", ".", "write the figures into `DIR` (created; files overwritten)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	src := stdin
	if *in != "" {
		f, err := os.Open(*in)
		if err != nil {
			return err
		}
		defer f.Close()
		src = f
	}
	var req request
	dec := json.NewDecoder(src)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	return writeFigures(ctx, stdout, &req, *out)
}

// writeFigures draws every suite of req that has something to draw and
// prints each path written.
func writeFigures(ctx context.Context, stdout io.Writer, req *request, dir string) error {
	var done []string
	for _, r := range req.Records {
		if slices.Contains(done, r.Suite) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		done = append(done, r.Suite)
		f, err := suiteFigure(req, r.Suite)
		if err != nil {
			return fmt.Errorf("plot %s: %w", r.Suite, err)
		}
		if f == nil {
			continue
		}
		ps, err := f.write(dir)
		for _, p := range ps {
			fmt.Fprintln(stdout, p)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
