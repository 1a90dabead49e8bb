package main

// Modules of their own under bench/ that the harness builds with the go
// command and runs as separate programs, so that their dependencies stay
// out of sandirect's go.mod: bench/plot (gonum/plot, for the report's
// figures) and bench/app (gRPC-go, for the app suite). bench/shmipc is
// built the same way by shmipc.go. Where a module cannot be found or
// built (no go command, no network for its first download), the caller
// says why and goes on without it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// errModuleSkipped says that a nested module could not be had here, and why.
var errModuleSkipped = errors.New("module skipped")

const moduleBuildMax = 5 * time.Minute // a first build downloads the dependencies

// nestedModule is one module under bench/.
type nestedModule struct {
	dir string // its directory under bench/, also the binary's name
	env string // the variable that names its directory instead; "0": leave it out
}

var (
	plotModule = nestedModule{dir: "plot", env: "SANDIRECT_BENCH_PLOT"}
	appModule  = nestedModule{dir: "app", env: "SANDIRECT_BENCH_APP"}
)

// find returns the module's directory: $env, else bench/DIR in the current
// directory or one above it (go run ./bench from the repository, go test
// in bench/), else next to this source file as it was compiled.
func (m nestedModule) find() (string, error) {
	if d := os.Getenv(m.env); d != "" {
		if d == "0" {
			return "", fmt.Errorf("%w: %s=0", errModuleSkipped, m.env)
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
		for _, d := range []string{filepath.Join(wd, "bench", m.dir), filepath.Join(wd, m.dir),
			filepath.Join(wd, "..", "bench", m.dir)} {
			if try(d) {
				return d, nil
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		if d := filepath.Join(filepath.Dir(file), m.dir); try(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w: module bench/%s not found (tried %s; set %s)", errModuleSkipped, m.dir,
		strings.Join(tried, ", "), m.env)
}

// build builds the module's program into dir and returns its path.
func (m nestedModule) build(ctx context.Context, dir string) (string, error) {
	src, err := m.find()
	if err != nil {
		return "", err
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		// As scripts/demo.sh and scripts/test.sh look for it.
		goCmd = "/usr/local/go/bin/go"
		if _, err := os.Stat(goCmd); err != nil {
			return "", fmt.Errorf("%w: no go command in PATH or /usr/local/go/bin", errModuleSkipped)
		}
	}
	bin := filepath.Join(dir, m.dir+"-bench")
	ctx, cancel := context.WithTimeout(ctx, moduleBuildMax)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil && ctx.Err() != context.Canceled {
			err = ctx.Err()
		}
		return "", fmt.Errorf("%w: go build in %s: %v: %s", errModuleSkipped, src, err, lastLines(string(out), 3))
	}
	return bin, nil
}
