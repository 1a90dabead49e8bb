package main

// The report's figures. They are drawn by bench/plot, a module of its own
// (gonum/plot stays out of sandirect's go.mod): writeReport builds it and
// sends it the records with what the figures' titles need.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
)

const plotRunMax = 2 * time.Minute

// floorTransports are the floor suite's ping-pongs, which other suites
// also measure as interleaved references.
var floorTransports = map[string]bool{"cacheline": true, "futex": true, "futex/unpinned": true, "futexcond/unpinned": true}

// plotTitles are the panel titles of suites whose numbers are not what the
// defaults say (half round trips, one-way GB/s); suites set theirs from
// init.
var plotTitles = map[string]plotMeta{}

// plotMeta is one suite's entry of bench/plot's request (bench/plot/main.go).
type plotMeta struct {
	Name           string `json:"name"`
	Doc            string `json:"doc"`
	LatencyTitle   string `json:"latency_title,omitempty"`
	LatencyLabel   string `json:"latency_label,omitempty"`
	BandwidthTitle string `json:"bandwidth_title,omitempty"`
	BandwidthLabel string `json:"bandwidth_label,omitempty"`
}

type plotRequest struct {
	Hardware   string     `json:"hardware"`
	Suites     []plotMeta `json:"suites"`
	References []string   `json:"references"`
	Records    []Record   `json:"records"`
}

// plotReport draws one figure per suite of recs into dir (SUITE.svg and
// SUITE.png) and returns the paths written. An error matching
// errModuleSkipped says that bench/plot could not be built here.
func plotReport(ctx context.Context, dir string, recs []Record, hardware string) ([]string, error) {
	tmp, err := os.MkdirTemp("", "sandirect-plot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin, err := plotModule.build(ctx, tmp)
	if err != nil {
		return nil, err
	}
	req := plotRequest{Hardware: hardware, Records: recs}
	for _, s := range suites {
		m := plotTitles[s.Name]
		m.Name, m.Doc = s.Name, s.Doc
		req.Suites = append(req.Suites, m)
	}
	for _, r := range recs {
		if isReference(r.Transport) && !slices.Contains(req.References, r.Transport) {
			req.References = append(req.References, r.Transport)
		}
	}
	in, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, plotRunMax)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-out", dir)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var paths []string
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		if p := strings.TrimSpace(sc.Text()); p != "" {
			paths = append(paths, p)
		}
	}
	if err != nil {
		return paths, fmt.Errorf("bench/plot: %w: %s", err, lastLines(stderr.String(), 3))
	}
	return paths, nil
}
