package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// The whole bench as an unprivileged user (issue 21): uid 65534 with the
// RLIMIT_MEMLOCK it inherits (Debian's default, 8 MiB) and no eBPF. Every
// suite must complete, and the conn suite's largest stream must go over
// sockets too (it failed with ENOBUFS at 16 MiB). Tiny runs, as the other
// tests of run; shmipc-go is left out (building it needs a Go build cache
// of that user's).

func init() {
	testutil.RegisterChild("bench-unprivileged", func(args []string) error {
		testTiny = true
		os.Setenv(envShmipc, "0")
		dir, err := os.MkdirTemp("", "sandirect-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		path := filepath.Join(dir, "out.json")
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
		defer cancel()
		if err := run(ctx, os.Stdout, append([]string{"-quick", "-json", path, "-out", ""}, args...)); err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var recs []Record
		if err := json.Unmarshal(b, &recs); err != nil {
			return err
		}
		suites := map[string]int{}
		largest, ours := 0, 0
		for _, r := range recs {
			suites[r.Suite]++
			if r.Suite == "conn" && r.Case == "stream" && r.Value > 0 {
				largest = max(largest, r.Size)
				if r.Transport == "sockets/busy" {
					ours = max(ours, r.Size)
				}
			}
		}
		for _, s := range args {
			if suites[s] == 0 {
				return fmt.Errorf("suite %s: no record", s)
			}
		}
		if ours == 0 || ours < largest {
			return fmt.Errorf("conn: largest sockets/busy stream %d B, of any transport %d B", ours, largest)
		}
		return nil
	})
}

func TestRunUnprivileged(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child as uid 65534")
	}
	c := testutil.StartChildAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "bench-unprivileged", nil,
		"conn", "floor", "pin", "rdma", "ring")
	select {
	case <-c.Done():
	case <-time.After(2 * time.Minute):
		c.Cmd.Process.Signal(syscall.SIGQUIT) // its goroutines, for the log
		<-c.Done()
	}
	err := c.Wait(time.Second)
	t.Logf("output:\n%s", c.Output())
	if err != nil {
		t.Fatal(err)
	}
}
