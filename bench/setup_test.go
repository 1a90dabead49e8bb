package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestRunSetup runs the setup suite end to end, tiny: every row is there
// and the fresh processes of the first dial answered.
func TestRunSetup(t *testing.T) {
	tiny(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, &out, []string{"-quick", "-out", "", "setup"}); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("output:\n%s", out.String())
	for _, row := range []string{"dial      sockets/default", "dial      unix", "dial      tcp", "fallback  sockets/fallback",
		"firstdial sockets/default", "accept    sockets/1 ", "accept    sockets/16", "setup first dial in a fresh process"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("no row %q", row)
		}
	}
}
