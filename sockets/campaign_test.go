package sockets

// Machinery of the reliability campaign (issue 8; docs/security.md maps
// its claims to its tests). The campaign's tests are named TestCampaign…
// so that CI runs them as one step (scripts/test.sh).

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/gopool"
	"github.com/sandirect/sandirect/internal/testutil"
)

// A child tells the parent where it is by lines on a pipe (its fd 3): the
// parent waits on the pipe, never on a sleep.

// say writes one line to the parent (child side).
func say(s string) {
	notesOnce.Do(func() { notesOut = os.NewFile(3, "notes") })
	fmt.Fprintln(notesOut, s)
}

// notesOut is the child's end of the pipe: one *os.File, whose finalizer
// would close fd 3.
var (
	notesOnce sync.Once
	notesOut  *os.File
)

// notes reads a child's lines.
type notes struct {
	f     *os.File
	r     *bufio.Reader
	child *testutil.Child
}

// startNoted starts child name with a notes pipe as its fd 3.
func startNoted(t *testing.T, name string, args ...string) (*testutil.Child, *notes) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	child := testutil.StartChild(t, name, []*os.File{w}, args...)
	w.Close()
	return child, &notes{f: r, r: bufio.NewReader(r), child: child}
}

// wait reads lines until one equals want, for at most 20 s.
func (n *notes) wait(t *testing.T, want string) {
	t.Helper()
	n.f.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		l, err := n.r.ReadString('\n')
		if err != nil {
			select {
			case <-n.child.Done(): // all its output is in
			case <-time.After(5 * time.Second):
			}
			t.Fatalf("waiting for the child to say %q: %v; child output:\n%s", want, err, n.child.Output())
		}
		if l = strings.TrimSpace(l); l == want {
			return
		}
		if strings.HasPrefix(l, "error") {
			t.Fatalf("child: %s; output:\n%s", l, n.child.Output())
		}
	}
}

// close closes the parent's end of the pipe.
func (n *notes) close() { n.f.Close() }

// parkForever blocks a child until it is killed. (A sleep, not select{}:
// with every goroutine blocked otherwise the runtime would call it a
// deadlock and exit.)
func parkForever() {
	for {
		time.Sleep(time.Hour)
	}
}

// baseline is what a campaign test must give back: fds, shared mappings,
// goroutines and locked memory (the kernel's count of pinned bytes).
type baseline struct {
	res        testutil.Resources
	goroutines int
	lockedKB   int
}

func takeBaseline(t *testing.T) baseline {
	t.Helper()
	return baseline{res: testutil.Snapshot(), goroutines: liveGoroutines(), lockedKB: lockedKB(t)}
}

// check fails t when more is held now than at the baseline. Exiting
// goroutines and unlocking memory get a grace period, polled.
func (b baseline) check(t *testing.T) {
	t.Helper()
	if err := b.res.CheckLeaks(); err != nil {
		t.Errorf("after the test: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var g, l int
	for {
		g, l = liveGoroutines(), lockedKB(t)
		if (g <= b.goroutines && l <= b.lockedKB) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // poll: goroutines exiting, memory unlocking
	}
	if g > b.goroutines {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines before, %d after:\n%s", b.goroutines, g, buf[:runtime.Stack(buf, true)])
	}
	if l > b.lockedKB {
		t.Errorf("locked memory %d kB before, %d kB after", b.lockedKB, l)
	}
}

// liveGoroutines counts the program's goroutines less the workers of
// package gopool waiting for work: those the connections' set-up and
// teardown keep for the next connection, for up to a second.
func liveGoroutines() int {
	return runtime.NumGoroutine() - gopool.Idle()
}

// lockedKB returns the process's locked memory in kB (VmLck).
func lockedKB(t *testing.T) int {
	t.Helper()
	return procStatus(t, "VmLck")
}

// procStatus returns a kB or count field of /proc/self/status.
func procStatus(t *testing.T, field string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// within runs f, failing t if it does not return within d: a hang fails
// the test instead of the suite.
func within[T any](t *testing.T, what string, d time.Duration, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: no return within %v", what, d)
		panic("unreachable")
	}
}

// waitFor polls cond (a counter of ours) until it holds, for at most 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: timed out", what)
		}
		time.Sleep(100 * time.Microsecond) // poll a counter
	}
}

// debugState describes the session for a failure message.
func (c *Conn) debugState() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fmt.Sprintf("sent %d peerAck %d peerWin %d | recv %d consumed %d ackSent %d win %d owedAt %d | ctlq %v inPos %d relPos %d held %d polling %v sleeping %v pumping %v | rd %+v | wtx ", c.sent.load(), c.peerAck.load(), c.peerWindow, c.received, c.consumed, c.ackSent.load(), c.window, c.owedAt, c.ctlq, c.inPos, c.relPos, c.heldN, c.polling, c.sleeping, c.pumping, c.rd)
	if c.wtx != nil {
		x := *c.wtx
		x.src, x.temp = nil, nil
		s += fmt.Sprintf("%+v", x)
	}
	s += fmt.Sprintf(" | txq %d | rx:", len(c.txq))
	for i := c.rxHead; i < len(c.rx); i++ {
		e := c.rx[i]
		s += fmt.Sprintf(" {%v data %d id %d size %d off %d}", e.kind, len(e.data), e.id, e.size, e.off)
	}
	return s
}
