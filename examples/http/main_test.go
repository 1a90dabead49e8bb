package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// run's both-ends mode starts this binary with -server: be the server.
	if len(os.Args) > 1 && os.Args[1] == "-server" {
		if err := run(context.Background(), os.Stdout, os.Args[1:]); err != nil {
			os.Stderr.WriteString("http server: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The example as its doc runs it: the server in a second process answers
// the client's GET.
func TestHTTPBothEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, []string{"-name", "Ada & Grace", "-addr", filepath.Join(t.TempDir(), "http.sock")}); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^hello, Ada & Grace, from process (\d+)\n$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("answer %q", out.String())
	}
	if m[1] == fmt.Sprint(os.Getpid()) {
		t.Errorf("answered by this process, not a server process")
	}
}

// Requests one after the other reuse the client's keep-alive connection;
// requests from goroutines at once are answered too. The server is in
// this process here.
func TestHTTPKeepAlive(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := filepath.Join(t.TempDir(), "http.sock")
	served := make(chan error, 1)
	ready := &lineWaiter{line: make(chan struct{})}
	go func() { served <- serve(ctx, addr, ready) }()
	select {
	case <-ready.line:
	case err := <-served:
		t.Fatal(err)
	}
	cl := newClient(addr)
	defer cl.CloseIdleConnections()
	var fresh atomic.Int64
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			fresh.Add(1)
		}
	}}
	hello := func(name string) error {
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet,
			"http://example/hello?name="+name, nil)
		if err != nil {
			return err
		}
		resp, err := cl.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if want := fmt.Sprintf("hello, %s, from process %d\n", name, os.Getpid()); err == nil && string(b) != want {
			err = fmt.Errorf("got %q, want %q", b, want)
		}
		return err
	}
	for i := range 50 {
		if err := hello(fmt.Sprint("seq", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := fresh.Load(); n != 1 {
		t.Errorf("50 requests one after the other opened %d connections, want 1", n)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8*20)
	for i := range 8 {
		wg.Go(func() {
			for j := range 20 {
				if err := hello(fmt.Sprintf("client%d-%d", i, j)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// lineWaiter closes line at the first write: serve's "listening on".
type lineWaiter struct {
	line chan struct{}
	done bool
}

func (w *lineWaiter) Write(p []byte) (int, error) {
	if !w.done {
		w.done = true
		close(w.line)
	}
	return len(p), nil
}
