// Package testutil holds test helpers shared by the project's packages:
// re-execution of the test binary as a real peer process, and a TestMain that
// fails the run when it leaks file descriptors or shared mappings.
//
// It imports nothing of the project's and is used only from tests.
package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	envChild = "SANDIRECT_TEST_CHILD"
	envArgs  = "SANDIRECT_TEST_ARGS"
)

// ChildFunc is the body of a child process. Files passed by StartChild are
// fds 3, 4, … (os.NewFile). A non-nil error makes the child exit 1.
type ChildFunc func(args []string) error

var (
	childrenMu sync.Mutex // guards children
	children   = map[string]ChildFunc{}
)

// RegisterChild makes name runnable by StartChild. Call it from init or
// before Main.
func RegisterChild(name string, f ChildFunc) {
	childrenMu.Lock()
	defer childrenMu.Unlock()
	children[name] = f
}

// IsChild tells whether this process runs as a child.
func IsChild() bool { return os.Getenv(envChild) != "" }

// Main is a TestMain: in a child process it runs the registered child and
// exits; otherwise it runs the tests and then fails the run if file
// descriptors or memfd mappings are left over that were not there before.
//
// The cleanups run after the tests and before the leak check: they release
// what the process keeps on purpose past its last user (an idle monitor).
func Main(m *testing.M, cleanups ...func() error) {
	if name := os.Getenv(envChild); name != "" {
		os.Exit(runChild(name))
	}
	// Start the network poller now so its own fds are in the baseline.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	before := Snapshot()
	code := m.Run()
	for _, f := range cleanups {
		if err := f(); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: cleanup after tests:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := before.CheckLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: resource leak after tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func runChild(name string) int {
	childrenMu.Lock()
	f := children[name]
	childrenMu.Unlock()
	if f == nil {
		fmt.Fprintf(os.Stderr, "child %q is not registered\n", name)
		return 2
	}
	var args []string
	if a := os.Getenv(envArgs); a != "" {
		args = strings.Split(a, "\x1f")
	}
	if err := f(args); err != nil {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", name, err)
		return 1
	}
	return 0
}

// Child is a running child process.
type Child struct {
	Cmd    *exec.Cmd
	output syncBuffer
	done   chan struct{}
	err    error
}

// StartChild starts the test binary again running the child registered as
// name. files become the child's fds 3, 4, …. The child is killed when the
// test ends if it is still running.
func StartChild(tb testing.TB, name string, files []*os.File, args ...string) *Child {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatalf("os.Executable: %v", err)
	}
	return startChild(tb, exe, nil, name, files, args)
}

func startChild(tb testing.TB, exe string, attr *syscall.SysProcAttr, name string, files []*os.File, args []string) *Child {
	tb.Helper()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.SysProcAttr = attr
	cmd.Env = append(os.Environ(), envChild+"="+name, envArgs+"="+strings.Join(args, "\x1f"))
	cmd.ExtraFiles = files
	c := &Child{Cmd: cmd, done: make(chan struct{})}
	cmd.Stdout = &c.output
	cmd.Stderr = &c.output
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start child %s: %v", name, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	tb.Cleanup(func() {
		c.Kill()
		<-c.done
	})
	return c
}

// Wait waits for the child to exit, at most timeout, and returns its exit
// error together with its output.
func (c *Child) Wait(timeout time.Duration) error {
	select {
	case <-c.done:
	case <-time.After(timeout):
		c.Kill()
		<-c.done
		return fmt.Errorf("child did not exit within %v; output:\n%s", timeout, c.Output())
	}
	if c.err != nil {
		return fmt.Errorf("child: %w; output:\n%s", c.err, c.Output())
	}
	return nil
}

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Kill sends SIGKILL to the child.
func (c *Child) Kill() {
	if c.Cmd.Process != nil {
		c.Cmd.Process.Kill()
	}
}

// Output returns what the child printed so far.
func (c *Child) Output() string { return c.output.String() }

type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
