package main

// Suite setup: what a connection costs to make, as a program that dials
// per request pays it. A peer process serves an echo on three listeners —
// sockets (network "sandirect"), a Unix stream socket and plain TCP on
// loopback (net.Listen, not ours) — and this process dials them:
//
//   - dial: dial, write 64 B, read the echo, close; one sample each, the
//     transports in turn (sockets/default with sockets.DefaultConfig,
//     unix, tcp), so that drift falls on all alike.
//   - fallback: sockets.Dial("tcp") to the plain TCP service, which is not
//     ours (sockets/fallback), against net.Dial to it (the tcp row).
//   - firstdial: the first sockets.Dial of a fresh process (this binary
//     again, with nothing of ours open before), timed inside it.
//   - accept: connections per second (dial, echo, close) that the peer's
//     listener accepts from 1 and from 16 dialing goroutines.
//
// The latency columns of this suite are whole durations (not halves of a
// round trip).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/sockets"
)

const envFirstDial = "SANDIRECT_BENCH_FIRST_DIAL" // a fresh process's one dial: the address

func init() {
	register(&Suite{
		Name: "setup",
		Doc:  "connection set-up: dial+echo+close (sockets, unix, tcp), fallback dial, first dial in a fresh process, accepts/s",
		Run:  runSetup,
		Rows: func(*Env) int { return 7 },
	})
	registerPeer("setup", setupPeer)
	targets = append(targets,
		target{"setup dial+echo+close sockets p50 / unix p50",
			recordKey{"setup", "dial", "sockets/default", 64, metricLatP50},
			recordKey{"setup", "dial", "unix", 64, metricLatP50}, 1.5, true, nil},
		target{"setup fallback dial to plain TCP p50 / net.Dial p50",
			recordKey{"setup", "fallback", "sockets/fallback", 64, metricLatP50},
			recordKey{"setup", "dial", "tcp", 64, metricLatP50}, 1.2, true, nil})
	goals = append(goals, goal{name: "setup first dial in a fresh process p50, ms",
		key: recordKey{"setup", "firstdial", "sockets/default", 0, metricLatP50}, unit: 1e6, limit: 5, atMost: true})
}

// setupAddrs are the peer's listeners: sockets, unix, tcp, '|'-separated.
type setupAddrs struct{ shm, unix, tcp string }

func (a setupAddrs) String() string { return a.shm + "|" + a.unix + "|" + a.tcp }

func parseSetupAddrs(s string) (setupAddrs, error) {
	p := strings.Split(s, "|")
	if len(p) != 3 {
		return setupAddrs{}, fmt.Errorf("setup addresses %q", s)
	}
	return setupAddrs{p[0], p[1], p[2]}, nil
}

// echoOnce dials with dial, writes 64 bytes, reads them back and closes.
func echoOnce(dial func() (net.Conn, error), buf []byte) error {
	c, err := dial()
	if err != nil {
		return err
	}
	if _, err := c.Write(buf); err != nil {
		c.Close()
		return err
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		c.Close()
		return err
	}
	return c.Close()
}

func runSetup(ctx context.Context, env *Env) ([]Record, error) {
	p, err := startPeerFiles(env, "setup")
	if err != nil {
		return nil, err
	}
	defer p.close()
	// A free port for the plain TCP service, taken again by the peer.
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	tcpAddr := tl.Addr().String()
	tl.Close()
	addrs := setupAddrs{
		shm:  fmt.Sprintf("@sandirect-bench-setup-%d", os.Getpid()),
		unix: fmt.Sprintf("@sandirect-bench-setup-unix-%d", os.Getpid()),
		tcp:  tcpAddr,
	}
	var recs []Record
	cmd := ctlMsg{Op: "serve", Addr: addrs.String(), Unpinned: true}
	err = p.run(ctx, cmd, func(error) {}, func() error {
		r, err := setupMeasure(ctx, env, addrs)
		recs = r
		if c, derr := net.Dial("unix", addrs.unix+"-stop"); derr == nil {
			c.Close()
		} else if err == nil {
			err = fmt.Errorf("stop the peer: %w", derr)
		}
		return err
	})
	return recs, err
}

func setupMeasure(ctx context.Context, env *Env, a setupAddrs) ([]Record, error) {
	n := 2000
	if env.quick {
		n = 500
	}
	if testTiny {
		n = 20
	}
	type row struct {
		cas, name string
		dial      func() (net.Conn, error)
		samples   []int64
	}
	rows := []*row{
		{"dial", "sockets/default", func() (net.Conn, error) { return sockets.Dial("sandirect", a.shm) }, nil},
		{"dial", "unix", func() (net.Conn, error) { return net.Dial("unix", a.unix) }, nil},
		{"dial", "tcp", func() (net.Conn, error) { return net.Dial("tcp", a.tcp) }, nil},
		{"fallback", "sockets/fallback", func() (net.Conn, error) { return sockets.Dial("tcp", a.tcp) }, nil},
	}
	buf := make([]byte, 64)
	for _, r := range rows { // warm: the device, the listeners' first accepts
		for range 10 {
			if err := echoOnce(r.dial, buf); err != nil {
				return nil, fmt.Errorf("%s: %w", r.name, err)
			}
		}
	}
	for i := 0; i < n; i++ {
		if i%64 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		for _, r := range rows {
			t0 := time.Now()
			if err := echoOnce(r.dial, buf); err != nil {
				return nil, fmt.Errorf("%s: %w", r.name, err)
			}
			r.samples = append(r.samples, 2*int64(time.Since(t0)))
		}
	}
	var recs []Record
	for _, r := range rows {
		recs = append(recs, env.Report(Result{Case: r.cas, Transport: r.name, Size: 64, Lat: summarize(r.samples), Preempted: -1})...)
	}
	first, err := firstDials(ctx, env, a.shm)
	if err != nil {
		return recs, err
	}
	recs = append(recs, env.Report(Result{Case: "firstdial", Transport: "sockets/default", Lat: summarize(first), Preempted: -1})...)
	for _, g := range []int{1, 16} {
		rate, err := acceptRate(ctx, env, a.shm, g)
		if err != nil {
			return recs, err
		}
		fmt.Fprintf(env.out, "(accept sockets/%d: %.0f connections/s)\n", g, rate)
		recs = append(recs, env.Report(Result{Case: "accept", Transport: fmt.Sprintf("sockets/%d", g), Size: 64,
			HasBW: true, BW: rate * 64 / 1e9, Rate: rate / 1e6, Preempted: -1})...)
	}
	return recs, nil
}

// firstDials runs this binary again, a few times, each process timing its
// first sockets.Dial (and echo) to addr; it returns the durations, doubled
// like round trips.
func firstDials(ctx context.Context, env *Env, addr string) ([]int64, error) {
	runs := 10
	if env.quick || testTiny {
		runs = 5
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var out []int64
	for range runs {
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), envFirstDial+"="+addr)
		b, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("first dial process: %w", err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("first dial process said %q", b)
		}
		out = append(out, 2*ns)
	}
	return out, nil
}

// firstDialMain is the body of a fresh process of firstDials: it prints
// how long its first dial, echo and close to addr took, in ns.
func firstDialMain(addr string) int {
	buf := make([]byte, 64)
	t0 := time.Now()
	if err := echoOnce(func() (net.Conn, error) { return sockets.Dial("sandirect", addr) }, buf); err != nil {
		fmt.Fprintln(os.Stderr, "bench first dial:", err)
		return 1
	}
	fmt.Println(int64(time.Since(t0)))
	return 0
}

// acceptRate dials addr from goroutines goroutines, each in a loop of
// dial, echo and close, for the plan's time, and returns the connections
// per second.
func acceptRate(ctx context.Context, env *Env, addr string, goroutines int) (float64, error) {
	d := max(env.plan.latTime, 200*time.Millisecond)
	if testTiny {
		d = 50 * time.Millisecond
	}
	var (
		count atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex // guards firstErr
		first error
	)
	end := time.Now().Add(d)
	t0 := time.Now()
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64)
			for time.Now().Before(end) && ctx.Err() == nil {
				if err := echoOnce(func() (net.Conn, error) { return sockets.Dial("sandirect", addr) }, buf); err != nil {
					errMu.Lock()
					first = errors.Join(first, err)
					errMu.Unlock()
					return
				}
				count.Add(1)
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return 0, fmt.Errorf("accept rate with %d dialers: %w", goroutines, first)
	}
	return float64(count.Load()) / time.Since(t0).Seconds(), nil
}

// setupPeer serves the echo on the three listeners of the command until
// the parent's measurement ends.
func setupPeer(pc *peerConn) error {
	return pc.serve(func(cmd ctlMsg) error {
		if cmd.Op != "serve" {
			return fmt.Errorf("unknown command %q", cmd.Op)
		}
		a, err := parseSetupAddrs(cmd.Addr)
		if err != nil {
			return err
		}
		ls := make([]net.Listener, 0, 3)
		defer func() {
			for _, l := range ls {
				l.Close()
			}
		}()
		for _, l := range []struct{ netw, addr string }{{"sandirect", a.shm}, {"unix", a.unix}, {"tcp", a.tcp}} {
			var ln net.Listener
			if l.netw == "sandirect" {
				ln, err = sockets.Listen(l.netw, l.addr)
			} else {
				ln, err = net.Listen(l.netw, l.addr)
			}
			if err != nil {
				return fmt.Errorf("listen %s %s: %w", l.netw, l.addr, err)
			}
			ls = append(ls, ln)
			go echoServe(ln)
		}
		stop, err := net.Listen("unix", a.unix+"-stop")
		if err != nil {
			return err
		}
		defer stop.Close()
		if err := pc.ready(); err != nil {
			return err
		}
		// The parent measures now; it connects to stop when it is done.
		c, err := stop.Accept()
		if err == nil {
			c.Close()
		}
		return err
	})
}

// echoServe accepts on ln and echoes each connection until its peer
// closes it.
func echoServe(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			io.Copy(c, c)
			c.Close()
		}()
	}
}
