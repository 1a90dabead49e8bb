package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/pin"
	"github.com/sandirect/sandirect/sockets"
)

// The devices' idle eBPF monitor (pin.SetIdleMonitorLinger) is closed
// before the leak check.
func TestMain(m *testing.M) { testutil.Main(m, pin.CloseIdleMonitors) }

// The workload child: two devices connected by a queue pair; the first
// sends to the second, a few messages every millisecond, and a sockets
// connection carries a message the same way, until killed.
func init() {
	testutil.RegisterChild("workload", func(args []string) error {
		a, err := nic.Open(nil)
		if err != nil {
			return err
		}
		defer a.Close()
		b, err := nic.Open(nil)
		if err != nil {
			return err
		}
		defer b.Close()
		ln, err := b.Listen(fmt.Sprintf("@sdstat-test-%d", os.Getpid()))
		if err != nil {
			return err
		}
		defer ln.Close()
		acq, bcq := a.NewCQ(), b.NewCQ()
		accepted := make(chan error, 1)
		var bqp *nic.QueuePair
		go func() {
			var err error
			bqp, err = ln.Accept(nic.QPOptions{SendCQ: bcq, RecvCQ: bcq})
			accepted <- err
		}()
		aqp, err := a.Dial(ln.Addr().String(), nic.QPOptions{SendCQ: acq, RecvCQ: acq})
		if err != nil {
			return err
		}
		if err := <-accepted; err != nil {
			return err
		}
		buf := make([]byte, 256)
		mr, err := b.Register(buf, nic.AccessLocalWrite)
		if err != nil {
			return err
		}
		sln, err := sockets.Listen("sandirect", fmt.Sprintf("@sdstat-test-sock-%d", os.Getpid()))
		if err != nil {
			return err
		}
		defer sln.Close()
		sacc := make(chan net.Conn, 1)
		go func() {
			c, _ := sln.Accept()
			sacc <- c
		}()
		sc, err := sockets.Dial("sandirect", sln.Addr().String())
		if err != nil {
			return err
		}
		defer sc.Close()
		ss := <-sacc
		if ss == nil {
			return errors.New("sockets accept failed")
		}
		defer ss.Close()
		fmt.Println("ready")
		msg := []byte("hello, sdstat")
		sbuf := make([]byte, len(msg))
		var c [1]nic.Completion
		tick := time.NewTicker(time.Millisecond) // the workload's pace
		for range tick.C {
			if _, err := sc.Write(msg); err != nil {
				return err
			}
			if _, err := io.ReadFull(ss, sbuf); err != nil {
				return err
			}
			for range 4 {
				if err := bqp.PostRecv(nic.RecvWR{Buf: buf, LKey: mr.LKey}); err != nil {
					return err
				}
				if err := aqp.PostSend(nic.SendWR{Op: nic.OpSend, Local: msg}); err != nil {
					return err
				}
				for _, cq := range []*nic.CompletionQueue{acq, bcq} {
					if n, err := cq.Wait(c[:], time.Now().Add(10*time.Second)); err != nil || n != 1 || c[0].Status != nic.StatusSuccess {
						return fmt.Errorf("completion: %d, %v, %+v", n, err, c[0])
					}
				}
			}
		}
		return nil
	})
}

// sdstat runs the tool and returns what it printed.
func sdstat(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), &out, args)
	return out.String(), err
}

// poll runs cond until it holds, failing the test after 20 s.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll
	}
}

func decodePolls(t *testing.T, out string) []jsonPoll {
	t.Helper()
	var polls []jsonPoll
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var p jsonPoll
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("bad JSON line %q: %v", sc.Text(), err)
		}
		polls = append(polls, p)
	}
	return polls
}

func counter(p jsonProcess, group, name string) (jsonCounter, bool) {
	for _, c := range p.Counters {
		if c.Group == group && c.Name == name {
			return c, true
		}
	}
	return jsonCounter{}, false
}

func findProc(polls []jsonPoll, pid int) (jsonProcess, bool) {
	if len(polls) == 0 {
		return jsonProcess{}, false
	}
	for _, p := range polls[len(polls)-1].Processes {
		if p.PID == pid {
			return p, true
		}
	}
	return jsonProcess{}, false
}

// TestEndToEnd runs sdstat against a live second process that moves data
// between two devices: it finds the process, sees its counters move, prints
// rates with -watch, and forgets the process when it dies.
func TestEndToEnd(t *testing.T) {
	child := testutil.StartChild(t, "workload", nil)
	pid := child.Cmd.Process.Pid
	spid := strconv.Itoa(pid)

	// One shot, JSON, every process: the child appears with its counters.
	var first uint64
	poll(t, "the child's sends in sdstat -json", func() bool {
		out, err := sdstat(t, "-json")
		if err != nil {
			t.Fatal(err)
		}
		p, ok := findProc(decodePolls(t, out), pid)
		if !ok {
			return false
		}
		c, ok := counter(p, "device/1", "sends")
		first = c.Value
		return ok && c.Value > 0
	})
	// The counters move: the nic's, and the sockets layer's.
	var firstSock uint64
	poll(t, "the child's sockets messages in sdstat -json", func() bool {
		out, err := sdstat(t, "-json", "-p", spid)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := findProc(decodePolls(t, out), pid)
		c, ok := counter(p, "sockets", "bytes_eager")
		firstSock = c.Value
		conns, _ := counter(p, "sockets", "connections")
		return ok && c.Value > 0 && conns.Value == 2
	})
	poll(t, "the child's sends and sockets bytes to grow", func() bool {
		out, err := sdstat(t, "-json", "-p", spid)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := findProc(decodePolls(t, out), pid)
		c, _ := counter(p, "device/1", "sends")
		sb, _ := counter(p, "sockets", "bytes_eager")
		return c.Value > first && sb.Value > firstSock
	})

	// The text table.
	out, err := sdstat(t, "-p", spid)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pid " + spid, "GROUP", "device/1 ", "device/1/qp/1", "device/2/pin", "bytes_received", "sockets ", "msgs_sent"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	t.Logf("sdstat -p %d (excerpt):\n%s", pid, excerpt(out, 12))

	// -watch: rates per second, and -g filters groups.
	out, err = sdstat(t, "-p", spid, "-watch", "150ms", "-count", "3", "-json", "-g", "device/2")
	if err != nil {
		t.Fatal(err)
	}
	polls := decodePolls(t, out)
	if len(polls) != 3 {
		t.Fatalf("%d updates, want 3:\n%s", len(polls), out)
	}
	p, _ := findProc(polls, pid)
	c, ok := counter(p, "device/2", "recvs")
	if !ok || c.Rate == nil || *c.Rate <= 0 {
		t.Errorf("device/2 recvs rate: %+v", c)
	}
	if _, ok := counter(p, "device/1", "sends"); ok {
		t.Errorf("-g device/2 shows device/1")
	}
	text, err := sdstat(t, "-p", spid, "-watch=100ms", "-count=2", "-g", "device/1/qp")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "RATE/s") || strings.Count(text, "--- ") != 2 {
		t.Errorf("watch output:\n%s", text)
	}
	t.Logf("sdstat -watch (excerpt):\n%s", excerpt(text, 8))

	// A dead process leaves the list, and -p says so.
	child.Kill()
	<-child.Done()
	poll(t, "the dead child to leave the list", func() bool {
		out, err := sdstat(t, "-json")
		if err != nil {
			t.Fatal(err)
		}
		_, ok := findProc(decodePolls(t, out), pid)
		return !ok
	})
	if _, err := sdstat(t, "-p", spid); err == nil || !strings.Contains(err.Error(), "no statistics endpoint") {
		t.Errorf("sdstat -p of a dead process: %v", err)
	}
}

// TestWatchEndsWithProcess: -watch -p returns when its process exits.
func TestWatchEndsWithProcess(t *testing.T) {
	child := testutil.StartChild(t, "workload", nil)
	pid := strconv.Itoa(child.Cmd.Process.Pid)
	poll(t, "the child's endpoint", func() bool {
		_, err := sdstat(t, "-p", pid)
		return err == nil
	})
	var out syncBuf
	done := make(chan error, 1)
	go func() { done <- run(context.Background(), &out, []string{"-p", pid, "-watch", "20ms"}) }()
	poll(t, "a first update", func() bool { return strings.Contains(out.String(), "RATE/s") })
	child.Kill()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("-watch did not end with its process")
	}
	if !strings.Contains(out.String(), "pid "+pid+" (sdstat.test): gone") {
		t.Errorf("no gone line:\n%s", excerpt(out.String(), 5))
	}
}

// TestInterrupt: cancelling the context ends -watch without an error.
func TestInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out syncBuf
	go func() { done <- run(ctx, &out, []string{"-watch", "10ms"}) }()
	poll(t, "a first update", func() bool { return strings.Contains(out.String(), "---") })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func init() {
	// The command itself, as a user runs it: main with these arguments.
	testutil.RegisterChild("main", func(args []string) error {
		os.Args = append([]string{"sdstat"}, args...)
		main()
		return nil
	})
}

// TestExitStatus runs the real main: an error is one line on stderr and
// exit status 1; success is status 0.
func TestExitStatus(t *testing.T) {
	c := testutil.StartChild(t, "main", nil, "-p", "999999999", "-watch", "10ms")
	err := c.Wait(20 * time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1", err)
	}
	out := c.Output()
	if !strings.HasPrefix(out, "sdstat: ") || strings.Count(out, "\n") != 1 {
		t.Errorf("stderr is not one line starting \"sdstat: \": %q", out)
	}
	c = testutil.StartChild(t, "main", nil, "-h")
	if err := c.Wait(20 * time.Second); err != nil {
		t.Fatalf("-h: %v", err)
	}
}

func TestArgs(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string // substring of the error; "" for success
	}{
		{name: "help", args: []string{"-h"}},
		{name: "unexpected", args: []string{"foo"}, want: `unexpected argument "foo"`},
		{name: "count without watch", args: []string{"-count", "2"}, want: "-count needs -watch"},
		{name: "bad watch", args: []string{"-watch=soon"}, want: "interval"},
		{name: "tiny watch", args: []string{"-watch", "1us"}, want: "at least 1ms"},
		{name: "negative pid", args: []string{"-p", "-3"}, want: "not a pid"},
		{name: "unknown flag", args: []string{"-x"}, want: "not defined"},
		{name: "bad env pid", env: map[string]string{envPID: "me"}, want: "SDSTAT_PID"},
		{name: "bad env json", env: map[string]string{envJSON: "perhaps"}, want: "SDSTAT_JSON"},
		{name: "bad env watch", env: map[string]string{envWatch: "soon"}, want: "SDSTAT_WATCH"},
		{name: "no such pid", args: []string{"-p", "999999999"}, want: "no statistics endpoint"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			out, err := sdstat(t, c.args...)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one with %q", err, c.want)
			}
			if c.name == "help" {
				for _, w := range []string{"-watch INTERVAL", "-json", "-p PID", "-count N", "-g PREFIX", envPID, envWatch, envCount, envJSON, envGroup} {
					if !strings.Contains(out, w) {
						t.Errorf("-h does not mention %s", w)
					}
				}
			}
		})
	}
}

func TestParseWatch(t *testing.T) {
	for _, c := range []struct {
		args  []string
		watch time.Duration
		count int
	}{
		{[]string{"-watch"}, time.Second, 0},
		{[]string{"-watch", "250ms"}, 250 * time.Millisecond, 0},
		{[]string{"-watch", "250ms", "-count", "3"}, 250 * time.Millisecond, 3},
		{[]string{"-watch=2s", "-count=1"}, 2 * time.Second, 1},
		{[]string{"-count", "4", "-watch"}, time.Second, 4},
		{nil, 0, 0},
	} {
		o, err := parseArgs(new(bytes.Buffer), c.args)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if o.watch != c.watch || o.count != c.count {
			t.Errorf("%q: watch %v count %d, want %v %d", c.args, o.watch, o.count, c.watch, c.count)
		}
	}
	t.Setenv(envWatch, "300ms")
	if o, err := parseArgs(new(bytes.Buffer), nil); err != nil || o.watch != 300*time.Millisecond {
		t.Errorf("SDSTAT_WATCH=300ms: %+v, %v", o, err)
	}
}

func excerpt(s string, lines int) string {
	l := strings.SplitN(s, "\n", lines+1)
	return strings.Join(l[:min(lines, len(l))], "\n")
}

type syncBuf struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
