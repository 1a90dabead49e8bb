package main

// The server process: gRPC-go's benchmark service and a net/http handler,
// each on all three transports, for the whole run. It tells the client its
// addresses in one JSON line on standard output and serves until its
// standard input closes (the client is done, or died).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/interop/grpc_testing"

	"github.com/sandirect/sandirect/sockets"
)

// envSpin carries -spin to the server process: the adaptive wait's Spin
// of sandirect's connections, both sides.
const envSpin = "SANDIRECT_APP_SPIN"

// sandirectConfig is the Config of sandirect's connections: nil (the
// default) unless -spin set a Spin.
func sandirectConfig() *sockets.Config {
	d, err := time.ParseDuration(os.Getenv(envSpin))
	if err != nil || d <= 0 {
		return nil
	}
	c := sockets.DefaultConfig()
	c.Wait.Spin = d
	return &c
}

// A transport is how the server listens and the client dials.
type transport struct {
	name   string // the suffix of the record's transport: grpc/NAME, http/NAME
	listen func(dir, tag string) (net.Listener, error)
	dial   func(ctx context.Context, addr string) (net.Conn, error)
}

var transports = []transport{
	{"sandirect",
		func(dir, tag string) (net.Listener, error) {
			lc := sockets.ListenConfig{Config: sandirectConfig()}
			return lc.Listen(context.Background(), "sandirect", filepath.Join(dir, tag+".sd"))
		},
		// As an application swaps it in: the default Config (unless -spin).
		func(ctx context.Context, addr string) (net.Conn, error) {
			return (&sockets.Dialer{Config: sandirectConfig()}).DialContext(ctx, "sandirect", addr)
		}},
	{"unix",
		func(dir, tag string) (net.Listener, error) {
			return net.Listen("unix", filepath.Join(dir, tag+".sock"))
		},
		func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}},
	{"tcp",
		func(dir, tag string) (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") },
		func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}},
}

func lookupTransport(name string) (transport, bool) {
	for _, t := range transports {
		if t.name == name {
			return t, true
		}
	}
	return transport{}, false
}

// serverAddrs are the server's listening addresses by protocol and
// transport name.
type serverAddrs struct {
	GRPC map[string]string `json:"grpc"`
	HTTP map[string]string `json:"http"`
}

// benchService answers as gRPC-go's own benchmark server does: a payload
// of the requested size, allocated per call.
type benchService struct {
	grpc_testing.UnimplementedBenchmarkServiceServer
}

func (benchService) UnaryCall(_ context.Context, req *grpc_testing.SimpleRequest) (*grpc_testing.SimpleResponse, error) {
	return &grpc_testing.SimpleResponse{Payload: &grpc_testing.Payload{Body: make([]byte, req.GetResponseSize())}}, nil
}

func (benchService) StreamingCall(s grpc.BidiStreamingServer[grpc_testing.SimpleRequest, grpc_testing.SimpleResponse]) error {
	for {
		req, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp := &grpc_testing.SimpleResponse{Payload: &grpc_testing.Payload{Body: make([]byte, req.GetResponseSize())}}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

// bodies serves GET /get?size=N with N bytes, from one buffer per size.
type bodies struct {
	mu sync.Mutex // guards m
	m  map[int][]byte
}

func (b *bodies) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.URL.Query().Get("size"))
	if err != nil || n < 0 || n > 64<<20 {
		http.Error(w, "want ?size=N, 0 <= N <= 64 MiB", http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	body := b.m[n]
	if body == nil {
		body = make([]byte, n)
		for i := range body {
			body[i] = byte(i)
		}
		b.m[n] = body
	}
	b.mu.Unlock()
	w.Header().Set("Content-Length", strconv.Itoa(n))
	w.Write(body)
}

// serveMain is the server process's body.
func serveMain(stdin io.Reader, stdout io.Writer) error {
	dir, err := os.MkdirTemp("", "sandirect-app-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	gs := grpc.NewServer()
	grpc_testing.RegisterBenchmarkServiceServer(gs, benchService{})
	hs := &http.Server{Handler: &bodies{m: map[int][]byte{}}}
	addrs := serverAddrs{GRPC: map[string]string{}, HTTP: map[string]string{}}
	errc := make(chan error, 2*len(transports))
	for _, t := range transports {
		gl, err := t.listen(dir, "grpc")
		if err != nil {
			return fmt.Errorf("listen %s for grpc: %w", t.name, err)
		}
		hl, err := t.listen(dir, "http")
		if err != nil {
			return fmt.Errorf("listen %s for http: %w", t.name, err)
		}
		addrs.GRPC[t.name], addrs.HTTP[t.name] = gl.Addr().String(), hl.Addr().String()
		go func() { errc <- gs.Serve(gl) }()
		go func() { errc <- hs.Serve(hl) }()
	}
	if err := json.NewEncoder(stdout).Encode(addrs); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, stdin); close(done) }()
	select {
	case <-done:
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	}
	gs.Stop()
	return hs.Close()
}

// ---- client side ----

// child is a server process started by this one.
type child struct {
	role   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr *outBuffer
	// exited is closed once the child's Wait returned, with its error
	// in waitErr (waitExit).
	exited  chan struct{}
	waitErr error
	waiting bool
}

const childStartMax = 30 * time.Second

// startChild runs this binary as role with args; it dies with us.
func startChild(ctx context.Context, role string, args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = append(os.Environ(), envRole+"="+role)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &child{role: role, cmd: cmd, stderr: &outBuffer{max: 8 << 10}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.stdout = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s process: %w", role, err)
	}
	return c, nil
}

// readJSON reads the child's next line into v, within d.
func (c *child) readJSON(v any, d time.Duration) error {
	type result struct {
		line []byte
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := c.stdout.ReadBytes('\n')
		ch <- result{line, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			// Its stdout ended: it exits, or did. Its stderr is all
			// there only once Wait has copied the rest of it.
			c.waitExit()
			select {
			case <-c.exited:
			case <-time.After(d):
			}
			return fmt.Errorf("%s process: %w (its stderr: %s)", c.role, r.err, c.stderr)
		}
		return json.Unmarshal(r.line, v)
	case <-time.After(d):
		c.cmd.Process.Kill()
		return fmt.Errorf("no answer from the %s process in %v (its stderr: %s)", c.role, d, c.stderr)
	}
}

// stop closes the child's stdin and waits for it to exit.
func (c *child) stop() error {
	c.stdin.Close()
	c.waitExit()
	select {
	case <-c.exited:
		if c.waitErr != nil {
			return fmt.Errorf("%s process: %w (its stderr: %s)", c.role, c.waitErr, c.stderr)
		}
		return nil
	case <-time.After(childStartMax):
		c.cmd.Process.Kill()
		<-c.exited
		return fmt.Errorf("%s process did not exit in %v (its stderr: %s)", c.role, childStartMax, c.stderr)
	}
}

// waitExit starts the child's Wait, once: after the reads of its stdout
// (Wait closes the pipe). c.exited closes when it returns.
func (c *child) waitExit() {
	if c.waiting {
		return
	}
	c.waiting = true
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
}

type server struct {
	*child
	addrs serverAddrs
}

func startServer(ctx context.Context) (*server, error) {
	c, err := startChild(ctx, "server")
	if err != nil {
		return nil, err
	}
	s := &server{child: c}
	if err := c.readJSON(&s.addrs, childStartMax); err != nil {
		c.stop()
		return nil, fmt.Errorf("server: %w", err)
	}
	return s, nil
}

// outBuffer keeps the first max bytes written to it: a child's stderr.
type outBuffer struct {
	mu  sync.Mutex // guards b
	b   []byte
	max int
}

func (t *outBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if room := t.max - len(t.b); room > 0 {
		t.b = append(t.b, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (t *outBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
