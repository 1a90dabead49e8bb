package main

// The idle case: many connections to a fresh server process, each with a
// server goroutine waiting in Read, as net/http and gRPC servers keep
// their connections. What it reports is the OS threads that the server
// process holds meanwhile.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// idleTransports are the idle case's transports, in record names: the
// Conn with the default Config, and the kernel's two.
var idleTransports = []string{"sockets/default", "unix", "tcp"}

const (
	// Connections opened first, to learn the fds each one takes: more
	// than the first ones that hold an fd of their own for a later
	// reuse (the nic keeps the queue-pair segment fds of 64: with a probe
	// of 16 each seemed to take two fds, and the case opened 7,400–9,900
	// connections of its 10,000).
	idleProbe     = 256
	idleFdSpare   = 256              // fds left to the runtime and the transport
	idleWaitMax   = 2 * time.Minute  // for every server goroutine to be in Read
	idleSettle    = 10               // thread counts in a row unchanged: settled
	idleSettleMax = 10 * time.Second // at most this long
	idlePoll      = 20 * time.Millisecond
)

// idleHello is the idle server's first line; idleStats its answer to a
// line "stats".
type idleHello struct {
	Addr       string `json:"addr"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	NoFile     int    `json:"nofile"`
}

type idleStats struct {
	Accepted int64  `json:"accepted"`
	Reading  int64  `json:"reading"` // goroutines in Read now
	Threads  int    `json:"threads"`
	Fds      int    `json:"fds"`
	Err      string `json:"err,omitempty"` // the first accept or serve failure
}

// idleMain is the idle server process's body.
func idleMain(stdin io.Reader, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("idle", flag.ContinueOnError)
	name := fs.String("transport", "", "the transport to listen on")
	maxThreads := fs.Int("max-threads", 0, "debug.SetMaxThreads; 0: Go's default")
	if err := fs.Parse(args); err != nil {
		return err
	}
	t, ok := lookupTransport(idleTransportName(*name))
	if !ok {
		return fmt.Errorf("unknown transport %q", *name)
	}
	if *maxThreads > 0 {
		// To count the threads rather than die at Go's limit of 10,000.
		debug.SetMaxThreads(*maxThreads)
	}
	nofile, err := raiseNoFile()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sandirect-app-idle-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ln, err := t.listen(dir, "idle")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	var accepted, reading atomic.Int64
	var failure atomic.Pointer[string]
	fail := func(err error) { s := err.Error(); failure.CompareAndSwap(nil, &s) }
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					fail(fmt.Errorf("accept: %w", err))
				}
				return
			}
			accepted.Add(1)
			go idleServe(c, &reading, fail)
		}
	}()
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(idleHello{ln.Addr().String(), runtime.GOMAXPROCS(0), nofile}); err != nil {
		return err
	}
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		if sc.Text() != "stats" {
			return fmt.Errorf("unknown command %q", sc.Text())
		}
		st := idleStats{Accepted: accepted.Load(), Reading: reading.Load(), Threads: threads(), Fds: fdCount()}
		if p := failure.Load(); p != nil {
			st.Err = *p
		}
		if err := enc.Encode(st); err != nil {
			return err
		}
	}
	return sc.Err()
}

// idleServe waits in Read, echoes what comes, until the connection ends.
func idleServe(c net.Conn, reading *atomic.Int64, fail func(error)) {
	defer c.Close()
	b := make([]byte, 1)
	for {
		reading.Add(1)
		n, err := c.Read(b)
		reading.Add(-1)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fail(fmt.Errorf("read: %w", err))
			}
			return
		}
		if _, err := c.Write(b[:n]); err != nil {
			fail(fmt.Errorf("write: %w", err))
			return
		}
	}
}

// raiseNoFile raises RLIMIT_NOFILE's soft limit to the hard one and
// returns it.
func raiseNoFile() (int, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return 0, fmt.Errorf("raise RLIMIT_NOFILE to %d: %w", l.Max, err)
		}
	}
	return int(min(l.Cur, 1<<30)), nil
}

// threads is the process's OS thread count, from /proc/self/status.
func threads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err == nil {
				return n
			}
		}
	}
	return -1
}

func fdCount() int {
	e, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(e)
}

// ---- client side ----

type idleServer struct {
	*child
	hello idleHello
}

func (s *idleServer) stats() (idleStats, error) {
	var st idleStats
	if _, err := io.WriteString(s.stdin, "stats\n"); err != nil {
		return st, fmt.Errorf("idle server: %w (its stderr: %s)", err, s.stderr)
	}
	if err := s.readJSON(&st, childStartMax); err != nil {
		return st, err
	}
	if st.Err != "" {
		return st, fmt.Errorf("idle server: %s", st.Err)
	}
	return st, nil
}

// waitReading waits until n server goroutines are in Read.
func (s *idleServer) waitReading(n int) (idleStats, error) {
	deadline := time.Now().Add(idleWaitMax)
	for {
		st, err := s.stats()
		if err != nil || st.Reading >= int64(n) {
			return st, err
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("%d of %d server goroutines in Read after %v", st.Reading, n, idleWaitMax)
		}
		time.Sleep(time.Millisecond)
	}
}

// settledThreads polls the thread count until it stops changing.
func (s *idleServer) settledThreads() (int, error) {
	deadline := time.Now().Add(idleSettleMax)
	last, same := -1, 0
	for same < idleSettle && time.Now().Before(deadline) {
		st, err := s.stats()
		if err != nil {
			return 0, err
		}
		if st.Threads == last {
			same++
		} else {
			last, same = st.Threads, 0
		}
		time.Sleep(idlePoll)
	}
	return last, nil
}

// measureIdle opens up to want idle connections over transport, counts the
// server's threads, wakes every connection and writes the row.
func measureIdle(ctx context.Context, w *rowWriter, want int, transport string) error {
	nofile, err := raiseNoFile()
	if err != nil {
		return err
	}
	c, err := startChild(ctx, "idle", "-transport", transport, "-max-threads", strconv.Itoa(2*want+10000))
	if err != nil {
		return err
	}
	s := &idleServer{child: c}
	defer s.stop()
	if err := c.readJSON(&s.hello, childStartMax); err != nil {
		return err
	}
	dial := idleDialer(transport, s.hello.Addr)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	n, note, err := idleOpen(ctx, s, dial, want, nofile, &conns)
	if err != nil {
		return err
	}
	if note != "" {
		if err := w.note("idle %s: %s", transport, note); err != nil {
			return err
		}
	}
	if _, err := s.waitReading(n); err != nil {
		return err
	}
	th, err := s.settledThreads()
	if err != nil {
		return err
	}
	wake, err := wakeAll(conns)
	if err != nil {
		return fmt.Errorf("wake %d connections: %w", n, err)
	}
	rec := func(m string, v float64) Record {
		return Record{Suite: suiteName, Case: "idle", Transport: transport, Metric: m, Value: v}
	}
	return w.row([]Record{rec(metricConns, float64(n)), rec(metricThreads, float64(th)),
		rec(metricProcs, float64(s.hello.GOMAXPROCS)), rec(metricWake, float64(wake.Nanoseconds()))})
}

// idleTransportName is the transport an idle record's transport names.
func idleTransportName(transport string) string {
	if transport == "sockets/default" {
		return "sandirect"
	}
	return transport
}

func idleDialer(transport, addr string) func(ctx context.Context) (net.Conn, error) {
	t, _ := lookupTransport(idleTransportName(transport))
	return func(ctx context.Context) (net.Conn, error) { return t.dial(ctx, addr) }
}

// idleOpen dials idleProbe connections, learns from the last of them how
// many fds each takes on both sides (the first may open the device), then
// dials up to want, as many as both processes' RLIMIT_NOFILE allows. A
// failing dial after the probe ends it early: the note says why.
func idleOpen(ctx context.Context, s *idleServer, dial func(context.Context) (net.Conn, error), want, nofile int,
	conns *[]net.Conn) (n int, note string, err error) {
	var s1 idleStats
	var f1 int
	for len(*conns) < min(want, idleProbe) {
		c, err := dial(ctx)
		if err != nil {
			return 0, "", fmt.Errorf("dial %d: %w", len(*conns)+1, err)
		}
		*conns = append(*conns, c)
		if len(*conns) == 1 {
			if s1, err = s.waitReading(1); err != nil {
				return 0, "", err
			}
			f1 = fdCount()
		}
	}
	if want <= idleProbe {
		return len(*conns), "", nil
	}
	s2, err := s.waitReading(idleProbe)
	if err != nil {
		return 0, "", err
	}
	f2 := fdCount()
	per := max(1, float64(f2-f1)/(idleProbe-1))
	srvPer := max(1, float64(s2.Fds-s1.Fds)/(idleProbe-1))
	allowed := idleProbe + int(min(float64(nofile-f2-idleFdSpare)/per, float64(s.hello.NoFile-s2.Fds-idleFdSpare)/srvPer))
	limit := want
	if allowed < want {
		limit = max(idleProbe, allowed)
		note = fmt.Sprintf("%d connections, not %d: RLIMIT_NOFILE is %d here and %d in the server, a connection takes %.1f and %.1f fds",
			limit, want, nofile, s.hello.NoFile, per, srvPer)
	}
	for len(*conns) < limit {
		c, err := dial(ctx)
		if err != nil {
			return len(*conns), fmt.Sprintf("%d connections, not %d: dial %d: %v", len(*conns), want, len(*conns)+1, err), nil
		}
		*conns = append(*conns, c)
	}
	return len(*conns), note, nil
}

// wakeAll writes a byte to every connection, then reads every echo.
func wakeAll(conns []net.Conn) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(idleWaitMax)
	b := []byte{1}
	for i, c := range conns {
		c.SetDeadline(deadline)
		if _, err := c.Write(b); err != nil {
			return 0, fmt.Errorf("write %d: %w", i, err)
		}
	}
	for i, c := range conns {
		if _, err := io.ReadFull(c, b); err != nil {
			return 0, fmt.Errorf("echo %d: %w", i, err)
		}
	}
	return time.Since(start), nil
}
