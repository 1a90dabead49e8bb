package stats

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // poll
	}
}

func listed(t *testing.T, pid int) bool {
	t.Helper()
	eps, err := List()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(eps, func(e Endpoint) bool { return e.PID == pid })
}

func openReader(t *testing.T, pid int) *Reader {
	t.Helper()
	r, err := Open(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestPublishLifecycle(t *testing.T) {
	before := testutil.Snapshot()
	pid := os.Getpid()
	if listed(t, pid) {
		t.Fatal("endpoint listed before any source registered")
	}
	var ctr atomic.Uint64
	unreg := Register("test/1", func(emit func(string, uint64)) {
		emit("ticks", ctr.Load())
		emit("bad name", 1)
		emit("const", 42)
	})
	if err := Err(); err != nil {
		t.Fatal(err)
	}
	if !listed(t, pid) {
		t.Fatal("endpoint not listed while a source is registered")
	}
	eps, _ := List()
	for _, e := range eps {
		if e.PID == pid && (e.Address != Address(pid) || e.Comm == "") {
			t.Errorf("endpoint %+v", e)
		}
	}
	r, err := Open(pid)
	if err != nil {
		t.Fatal(err)
	}
	ctr.Store(7)
	waitFor(t, "ticks=7", func() bool {
		s, err := r.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		v, _ := s.Get("test/1", "ticks")
		return v == 7
	})
	s, err := r.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := s.Get("test/1", "const"); !ok || v != 42 {
		t.Errorf("const = %d, %v", v, ok)
	}
	if s.Dropped != 1 || len(s.Counters) != 2 || s.PID != pid || s.Interval != DefaultConfig().Interval {
		t.Errorf("snapshot %+v", s)
	}
	if age := time.Since(s.Time); age < 0 || age > time.Minute {
		t.Errorf("refreshed %v ago", age)
	}

	// A second source joins the table; the first one leaves it.
	unreg2 := RegisterGroups(func(emit func(string, string, uint64)) {
		emit("test/2", "a", 1)
		emit("test/2/sub", "b", 2)
		emit("bad group!", "c", 3)
	})
	waitFor(t, "the second source", func() bool {
		s, _ := r.Snapshot()
		_, ok := s.Get("test/2/sub", "b")
		return ok
	})
	unreg()
	unreg() // idempotent
	waitFor(t, "the first source to leave", func() bool {
		s, _ := r.Snapshot()
		_, ok := s.Get("test/1", "ticks")
		return !ok
	})

	// The last one takes the endpoint, goroutine and segment with it.
	unreg2()
	if listed(t, pid) {
		t.Error("endpoint still listed after the last source left")
	}
	if _, err := r.Snapshot(); !errors.Is(err, ErrGone) {
		t.Errorf("Snapshot after the last unregister: %v, want ErrGone", err)
	}
	if _, err := Open(pid); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open after the last unregister: %v, want ErrNotFound", err)
	}
	r.Close()
	if _, err := r.Snapshot(); !errors.Is(err, ErrClosed) {
		t.Errorf("Snapshot after Close: %v", err)
	}
	if err := before.CheckLeaks(); err != nil {
		t.Fatal(err)
	}
}

func TestRegisterPanicsOnBadGroup(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	Register("no spaces", func(func(string, uint64)) {})
}

func TestConfigure(t *testing.T) {
	defer Configure(nil)
	if err := Configure(&Config{Interval: time.Microsecond}); err == nil {
		t.Error("1 µs interval accepted")
	}
	if err := Configure(&Config{Interval: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	unreg := Register("test/cfg", func(emit func(string, uint64)) { emit("calls", uint64(calls.Add(1))) })
	defer unreg()
	r := openReader(t, os.Getpid())
	waitFor(t, "ten refreshes", func() bool { return calls.Load() >= 10 })
	if s, err := r.Snapshot(); err != nil || s.Interval != 5*time.Millisecond {
		t.Errorf("interval %v, %v", s.Interval, err)
	}
	// Disabling stops publishing while the source stays registered …
	if err := Configure(&Config{Interval: 5 * time.Millisecond, Disable: true}); err != nil {
		t.Fatal(err)
	}
	if listed(t, os.Getpid()) {
		t.Error("endpoint listed while disabled")
	}
	if _, err := r.Snapshot(); !errors.Is(err, ErrGone) {
		t.Errorf("Snapshot while disabled: %v", err)
	}
	// … and enabling starts it again.
	if err := Configure(nil); err != nil {
		t.Fatal(err)
	}
	r2 := openReader(t, os.Getpid())
	if s, err := r2.Snapshot(); err != nil || len(s.Counters) != 1 {
		t.Errorf("after re-enabling: %+v, %v", s, err)
	}
}

// TestGrow publishes more counters than a new table holds: the publisher
// moves to a larger table and a reader of the old one follows it.
func TestGrow(t *testing.T) {
	var n atomic.Int64
	n.Store(10)
	unreg := Register("test/grow", func(emit func(string, uint64)) {
		for i := range n.Load() {
			emit("c"+strconv.Itoa(int(i)), uint64(i))
		}
	})
	defer unreg()
	r := openReader(t, os.Getpid())
	if s, err := r.Snapshot(); err != nil || len(s.Counters) != 10 {
		t.Fatalf("%d counters, %v", len(s.Counters), err)
	}
	n.Store(5000)
	pub.mu.Lock()
	pub.run.kick()
	pub.mu.Unlock()
	waitFor(t, "5000 counters", func() bool {
		s, err := r.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return len(s.Counters) == 5000
	})
	s, _ := r.Snapshot()
	if v, ok := s.Get("test/grow", "c4999"); !ok || v != 4999 || s.Dropped != 0 {
		t.Errorf("c4999 = %d, %v; dropped %d", v, ok, s.Dropped)
	}
	if err := Err(); err != nil {
		t.Error(err)
	}
}

func TestOpenErrors(t *testing.T) {
	for _, pid := range []int{0, -1} {
		if _, err := Open(pid); !errors.Is(err, ErrNotFound) {
			t.Errorf("Open(%d): %v", pid, err)
		}
	}
	// A live process without an endpoint: our own, with nothing registered.
	if _, err := Open(os.Getpid()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open(self) with no sources: %v", err)
	}
}

func init() {
	// The publisher child: registers a counter that grows by one every
	// millisecond, says "ready" and runs until killed.
	testutil.RegisterChild("publisher", func(args []string) error {
		var ticks atomic.Uint64
		unreg := Register("child/1", func(emit func(string, uint64)) {
			emit("ticks", ticks.Load())
			emit("pid", uint64(os.Getpid()))
		})
		defer unreg()
		fmt.Println("ready")
		for {
			time.Sleep(time.Millisecond) // the work being measured
			ticks.Add(1)
		}
	})
	// The reader child: opens args[0]'s table and reports the error.
	testutil.RegisterChild("reader", func(args []string) error {
		pid, err := strconv.Atoi(args[0])
		if err != nil {
			return err
		}
		r, err := Open(pid)
		if err == nil {
			r.Close()
			return errors.New("opened")
		}
		if !errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("want a permission error, got %w", err)
		}
		fmt.Println("refused:", err)
		return nil
	})
}

// TestCrossProcess reads a real second process's counters, sees them move,
// and sees the process vanish from the list when it dies.
func TestCrossProcess(t *testing.T) {
	c := testutil.StartChild(t, "publisher", nil)
	pid := c.Cmd.Process.Pid
	waitFor(t, "the child's endpoint", func() bool { return listed(t, pid) })
	r := openReader(t, pid)
	s1, err := r.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := s1.Get("child/1", "pid"); v != uint64(pid) {
		t.Fatalf("child/1 pid = %d, want %d", v, pid)
	}
	t1, _ := s1.Get("child/1", "ticks")
	waitFor(t, "ticks to move", func() bool {
		s, err := r.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		v, _ := s.Get("child/1", "ticks")
		return v > t1
	})
	c.Kill()
	<-c.Done()
	waitFor(t, "the endpoint to vanish", func() bool { return !listed(t, pid) })
	if _, err := r.Snapshot(); !errors.Is(err, ErrGone) {
		t.Errorf("Snapshot of a dead process: %v, want ErrGone", err)
	}
	if _, err := Open(pid); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open of a dead process: %v, want ErrNotFound", err)
	}
}

// TestPeerCred: another (unprivileged) user is refused.
func TestPeerCred(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a child as another user")
	}
	unreg := Register("test/cred", func(emit func(string, uint64)) { emit("x", 1) })
	defer unreg()
	c := testutil.StartChildAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "reader", nil, strconv.Itoa(os.Getpid()))
	if err := c.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Log(c.Output())
}

// TestZombie: a process that exited but is not reaped yet is gone too,
// though its pid and /proc entry stay. The child is started without
// testutil's reaper, so it stays a zombie until the test waits for it.
func TestZombie(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "SANDIRECT_TEST_CHILD=publisher") // testutil's child protocol
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait()
	defer cmd.Process.Kill()
	waitFor(t, "the child's endpoint", func() bool { return listed(t, pid) })
	r := openReader(t, pid)
	if _, err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	waitFor(t, "a zombie", func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return strings.Contains(string(b), ") Z ")
	})
	if _, err := r.Snapshot(); !errors.Is(err, ErrGone) {
		t.Errorf("Snapshot of a zombie: %v, want ErrGone", err)
	}
}
