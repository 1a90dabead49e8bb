package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// run's both-ends mode starts this binary with -server: be the server.
	if len(os.Args) > 1 && os.Args[1] == "-server" {
		if err := run(context.Background(), os.Stdout, os.Args[1:]); err != nil {
			os.Stderr.WriteString("echo server: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The example as its doc runs it: the server in a second process, the
// line echoed back.
func TestEchoBothEnds(t *testing.T) {
	for _, msg := range []string{"hello", "a longer line, " + string(bytes.Repeat([]byte("x"), 100_000))} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var out bytes.Buffer
		err := run(ctx, &out, []string{"-msg", msg, "-addr", filepath.Join(t.TempDir(), "echo.sock")})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if out.String() != msg+"\n" {
			t.Errorf("echoed %d bytes %.40q, want %d bytes %.40q", out.Len(), out.String(), len(msg)+1, msg)
		}
	}
}

func TestEchoBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-server", "-client"}, {"-server"}, {"-client"}} {
		if err := run(context.Background(), &bytes.Buffer{}, args); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
