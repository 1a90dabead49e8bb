// Command http is a net/http server and its client over sandirect. The
// server is http.Serve on a sandirect listener; the client is an
// http.Client whose Transport dials sandirect. Those two lines (marked
// "sandirect:" below) are the only change from a program over package
// net; handlers, requests and keep-alive are net/http's own.
//
//	go run ./http                        # both ends: the server in a second process
//	go run ./http -server -addr /tmp/http.sock
//	go run ./http -client -addr /tmp/http.sock -name Ada
//
// Run from the examples directory (go -C examples run ./http from the
// repository's root).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/sockets"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "http:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	server := fs.Bool("server", false, "serve only")
	client := fs.Bool("client", false, "GET /hello?name=NAME from the server at -addr, print the body")
	addr := fs.String("addr", "", "the server's Unix socket path (default: a new one in a temporary directory)")
	name := fs.String("name", "gopher", "the name the client sends")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *server && *client:
		return errors.New("-server and -client: pick one, or neither for both ends")
	case *server:
		return serve(ctx, *addr, stdout)
	case *client:
		return get(ctx, *addr, *name, stdout)
	}
	if *addr == "" {
		dir, err := os.MkdirTemp("", "sandirect-http-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		*addr = filepath.Join(dir, "http.sock")
	}
	srv, err := startServer(ctx, *addr)
	if err != nil {
		return err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	return get(ctx, *addr, *name, stdout)
}

func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello, %s, from process %d\n", r.URL.Query().Get("name"), os.Getpid())
	})
	return mux
}

// serve serves handler until ctx ends.
func serve(ctx context.Context, addr string, stdout io.Writer) error {
	if addr == "" {
		return errors.New("-server needs -addr")
	}
	// sandirect: with package net this line is net.Listen("unix", addr).
	ln, err := sockets.Listen("sandirect", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler()}
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newClient returns an http.Client whose connections are sandirect ones
// to addr, whatever host a URL names.
func newClient(addr string) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			// sandirect: with package net this is (&net.Dialer{}).DialContext(ctx, "unix", addr).
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&sockets.Dialer{}).DialContext(ctx, "sandirect", addr)
			},
		},
	}
}

// get asks the server at addr to greet name, and prints the answer.
func get(ctx context.Context, addr, name string, stdout io.Writer) error {
	if addr == "" {
		return errors.New("-client needs -addr")
	}
	cl := newClient(addr)
	defer cl.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://example/hello?name="+url.QueryEscape(name), nil)
	if err != nil {
		return err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", req.URL, resp.Status)
	}
	_, err = io.Copy(stdout, resp.Body)
	return err
}

// startServer runs this program with -server in a second process, which
// dies with this one, and returns once it listens.
func startServer(ctx context.Context, addr string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, "-server", "-addr", addr)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// Its first line says that it listens.
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("server process: %w", err)
	}
	return cmd, nil
}
