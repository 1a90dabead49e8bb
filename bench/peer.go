package main

// The peer process. Every measurement runs between this process and a second
// one: the same binary, re-executed with envPeer set to a role. The child
// inherits, as fd 3, one end of a Unix socketpair (the control socket) and,
// as fds 4, 5, …, the shared segments. Over the control socket the parent
// sends one command at a time (a JSON ctlMsg); the child attaches to the
// shared memory, answers "ready", takes part in the measurement, and answers
// "done" (with an error text if it failed). The parent closes the control
// socket when it has no more commands; the child then exits. The child also
// dies with the parent (PR_SET_PDEATHSIG) and, if the control socket closes
// while it is busy, exits at once.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

const (
	envPeer = "SANDIRECT_BENCH_PEER" // role of a peer process; empty in the parent

	ctlFd      = 3 // the child's control socket
	firstSegFd = 4 // the child's first segment

	readyTimeout = 10 * time.Second // child start, attach, answer
	doneTimeout  = 30 * time.Second // child's answer after the parent's side ended
	exitTimeout  = 5 * time.Second  // child exit after the control socket closed
)

// errPeerExited fails the parent's side of a measurement whose peer died.
var errPeerExited = errors.New("peer process exited")

// ctlMsg is one control message, in either direction.
type ctlMsg struct {
	Op       string `json:"op"`                 // command; "ready" or "done" from the child
	Mode     string `json:"mode,omitempty"`     // wait mode of ring commands
	Size     int    `json:"size,omitempty"`     // record size
	Capacity int    `json:"capacity,omitempty"` // ring capacity
	CPU      int    `json:"cpu"`                // CPU to pin the child's thread to; -1: none
	Unpinned bool   `json:"unpinned,omitempty"` // run the command on no particular thread (CPU is ignored)
	Addr     string `json:"addr,omitempty"`     // rdma: the address the child listens on
	Err      string `json:"err,omitempty"`      // in "done": the child's failure
	Preempt  int64  `json:"preempt,omitempty"`  // in "done": the child's preemptions
}

// A peerRole is the body of a child process: it serves commands from pc
// until pc.next reports the end.
type peerRole func(pc *peerConn) error

var (
	rolesMu sync.Mutex // guards roles
	roles   = map[string]peerRole{}
)

// registerPeer makes role runnable as a peer process; call it from init.
func registerPeer(name string, f peerRole) {
	rolesMu.Lock()
	defer rolesMu.Unlock()
	if roles[name] != nil {
		panic("bench: peer role " + name + " registered twice")
	}
	roles[name] = f
}

// ---- parent side ----

// peer is a running child process as seen by the parent. Its methods are
// called from one goroutine; the goroutines it starts only feed its
// channels.
type peer struct {
	role   string
	cmd    *exec.Cmd
	ctl    net.Conn
	enc    *json.Encoder
	msgs   chan ctlMsg // from the child, closed at EOF
	output *tailBuffer // the child's stdout and stderr
	exited chan struct{}
	closed chan struct{} // closed by close: stops the reader
	dead   atomic.Bool   // set when exited is closed
	err    error         // cmd.Wait's result, valid once exited is closed
	cpu    int
}

// startPeer starts this binary again as role, handing it segs.
func startPeer(env *Env, role string, segs ...*shm.Segment) (*peer, error) {
	var files []*os.File
	for _, s := range segs {
		f, err := s.File()
		if err != nil {
			closeFiles(files)
			return nil, err
		}
		files = append(files, f)
	}
	return startPeerFiles(env, role, files...)
}

// startPeerFiles starts this binary again as role; files become its fds 4,
// 5, … and are closed here, the child having its copies (on failure too).
func startPeerFiles(env *Env, role string, files ...*os.File) (*peer, error) {
	defer closeFiles(files)
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	mine, theirs, err := sys.UnixPair()
	if err != nil {
		return nil, fmt.Errorf("control socketpair: %w", err)
	}
	defer theirs.Close() // the child has its copy
	files = append([]*os.File{theirs}, files...)
	ctl, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}

	p := &peer{role: role, ctl: ctl, enc: json.NewEncoder(ctl), msgs: make(chan ctlMsg, 1),
		output: &tailBuffer{max: 16 << 10}, exited: make(chan struct{}), closed: make(chan struct{}),
		cpu: env.cpus[1]}
	p.cmd = exec.Command(exe)
	p.cmd.Env = append(os.Environ(), envPeer+"="+role)
	p.cmd.ExtraFiles = files
	p.cmd.Stdout = p.output
	p.cmd.Stderr = p.output
	// The child must never outlive us, even if we are killed.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn(p.cmd); err != nil {
		ctl.Close()
		return nil, fmt.Errorf("start peer %s: %w", role, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		p.dead.Store(true)
		close(p.exited)
	}()
	go func() {
		defer close(p.msgs)
		dec := json.NewDecoder(ctl)
		for {
			var m ctlMsg
			if err := dec.Decode(&m); err != nil {
				return
			}
			select {
			case p.msgs <- m:
			case <-p.closed:
				return
			}
		}
	}()
	return p, nil
}

// spawn starts cmd from a thread that never exits. PR_SET_PDEATHSIG fires
// when the *thread* that forked the child exits, and Go ends a thread when a
// goroutine that locked it returns without unlocking (as some monitors in
// this project do on purpose): a child forked from an arbitrary thread could
// be killed in the middle of a run.
func spawn(cmd *exec.Cmd) error { return spawnOn(cmd, -1) }

// spawnOn is spawn with the child's CPU affinity set to cpu (cpu < 0: the
// parent's): a child inherits the mask of the thread that forked it, and
// the peer tools (ucx_perftest, fi_pingpong) must run where the harness
// pins its own two processes.
func spawnOn(cmd *exec.Cmd, cpu int) error {
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // for good: this thread is never reused or ended
			for c := range spawns {
				c.done <- startOn(c.cmd, c.cpu)
			}
		}()
	})
	done := make(chan error, 1)
	spawns <- spawnCall{cmd, cpu, done}
	return <-done
}

// startOn starts cmd from the calling (locked) thread, pinned to cpu for
// the fork.
func startOn(cmd *exec.Cmd, cpu int) error {
	if cpu < 0 {
		return cmd.Start()
	}
	restore, err := sys.PinThread(cpu)
	if err != nil {
		return fmt.Errorf("pin to CPU %d: %w", cpu, err)
	}
	err = cmd.Start()
	if rerr := restore(); err == nil && rerr != nil {
		err = fmt.Errorf("restore CPU affinity: %w", rerr)
	}
	return err
}

type spawnCall struct {
	cmd  *exec.Cmd
	cpu  int
	done chan error
}

var (
	spawnOnce sync.Once
	spawns    = make(chan spawnCall)
)

// run performs one measurement: it sends cmd, waits until the child is
// ready, runs body (the parent's side), and waits for the child's "done".
// If the child dies or ctx ends while body runs, abort is called (from
// another goroutine) to make body return.
func (p *peer) run(ctx context.Context, cmd ctlMsg, abort func(error), body func() error) error {
	cmd.CPU = p.cpu
	runtime.GC() // no collection of earlier garbage during the measurement
	if err := p.enc.Encode(cmd); err != nil {
		return p.failure(fmt.Errorf("send %s command: %w", cmd.Op, err))
	}
	if err := p.await(ctx, "ready", readyTimeout); err != nil {
		return err
	}
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-p.exited:
			abort(errPeerExited)
		case <-ctx.Done():
			abort(ctx.Err())
		case <-stop:
		}
	}()
	err := body()
	close(stop)
	<-watched
	if err != nil {
		p.kill()
		return p.failure(err)
	}
	return p.await(ctx, "done", doneTimeout)
}

// await waits for the child's message op.
func (p *peer) await(ctx context.Context, op string, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case m, ok := <-p.msgs:
		switch {
		case !ok:
			return p.failure(fmt.Errorf("control socket closed while waiting for %q", op))
		case m.Err != "":
			return p.failure(fmt.Errorf("peer: %s", m.Err))
		case m.Op != op:
			return p.failure(fmt.Errorf("peer sent %q, want %q", m.Op, op))
		}
		preempted.Add(m.Preempt)
		return nil
	case <-p.exited:
		return p.failure(fmt.Errorf("waiting for %q: %w", op, errPeerExited))
	case <-ctx.Done():
		p.kill()
		return ctx.Err()
	case <-t.C:
		p.kill()
		return p.failure(fmt.Errorf("peer did not answer %q within %v", op, timeout))
	}
}

func (p *peer) kill() { p.cmd.Process.Kill() }

// failure adds to err what the child said and how it ended.
func (p *peer) failure(err error) error {
	p.kill()
	select {
	case <-p.exited:
	case <-time.After(exitTimeout):
	}
	msg := fmt.Sprintf("peer %s", p.role)
	if p.dead.Load() && p.err != nil {
		msg += " (" + p.err.Error() + ")"
	}
	if out := strings.TrimSpace(p.output.String()); out != "" {
		msg += ", its output: " + out
	}
	return fmt.Errorf("%w; %s", err, msg)
}

// close ends the child: it closes the control socket, waits for the child
// to exit (killing it after exitTimeout) and reports an unclean exit.
func (p *peer) close() error {
	close(p.closed)
	p.ctl.Close()
	t := time.NewTimer(exitTimeout)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		p.kill()
		<-p.exited
		return fmt.Errorf("peer %s did not exit after its control socket closed; output: %s", p.role, p.output.String())
	}
	if p.err != nil {
		return fmt.Errorf("peer %s: %w; output: %s", p.role, p.err, strings.TrimSpace(p.output.String()))
	}
	return nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// tailBuffer keeps the first max bytes written to it; safe for concurrent
// use.
type tailBuffer struct {
	mu  sync.Mutex // guards b
	b   bytes.Buffer
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if room := t.max - t.b.Len(); room > 0 {
		t.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.b.String()
}

// preempted counts the involuntary context switches of measuring threads
// (in pinned; the peer's arrive with its "done") since Env.Report last took
// them.
var preempted atomic.Int64

// pinned runs f on a locked OS thread restricted to cpu (cpu < 0: not
// restricted, but still locked), and counts how often that thread was
// preempted meanwhile. Calls nest (the rdma suite's interleaved ring
// rounds run inside its pinned thread): the outermost counts for all, and
// flushPreemptions hands what it counted so far to the next Report.
func pinned(cpu int, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cpu >= 0 {
		restore, err := sys.PinThread(cpu)
		if err != nil {
			return fmt.Errorf("pin thread to CPU %d: %w", cpu, err)
		}
		defer restore()
	}
	tid := sys.Gettid()
	pinCounts.Lock()
	c := pinCounts.m[tid]
	outer := c == nil
	if outer {
		c = new(pinCount)
		if pinCounts.m == nil {
			pinCounts.m = map[int]*pinCount{}
		}
		pinCounts.m[tid] = c
	}
	pinCounts.Unlock()
	if !outer {
		return f()
	}
	var err error
	c.last, err = sys.ThreadPreemptions()
	c.ok = err == nil
	defer func() {
		flushPreemptions()
		pinCounts.Lock()
		delete(pinCounts.m, tid)
		pinCounts.Unlock()
	}()
	return f()
}

// pinCount is what the outermost pinned of a thread has counted up to.
type pinCount struct {
	last int64 // the thread's preemptions when last flushed
	ok   bool  // they can be read
}

var pinCounts struct {
	sync.Mutex
	m map[int]*pinCount // by thread id
}

// flushPreemptions adds the calling thread's preemptions since the last
// flush to those the next Report takes, if the thread runs in pinned.
func flushPreemptions() {
	tid := sys.Gettid()
	pinCounts.Lock()
	c := pinCounts.m[tid]
	pinCounts.Unlock()
	if c == nil || !c.ok {
		return
	}
	if now, err := sys.ThreadPreemptions(); err == nil {
		preempted.Add(now - c.last)
		c.last = now
	}
}

// ---- child side ----

// peerConn is the child's end of the control socket.
type peerConn struct {
	enc  *json.Encoder
	cmds chan ctlMsg
	busy atomic.Bool // between a command and its "done"
}

// peerMain is the whole life of a child process.
func peerMain(role string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "bench peer %s: %v\n", role, err)
		return 1
	}
	rolesMu.Lock()
	body := roles[role]
	rolesMu.Unlock()
	if body == nil {
		return fail(errors.New("unknown role"))
	}
	f := os.NewFile(ctlFd, "control")
	if f == nil {
		return fail(errors.New("no control socket"))
	}
	ctl, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fail(fmt.Errorf("control socket: %w", err))
	}
	pc := &peerConn{enc: json.NewEncoder(ctl), cmds: make(chan ctlMsg)}
	go func() {
		dec := json.NewDecoder(ctl)
		for {
			var m ctlMsg
			if err := dec.Decode(&m); err != nil {
				if pc.busy.Load() {
					// The parent is gone mid-measurement; the main
					// goroutine may spin forever on shared memory.
					fmt.Fprintf(os.Stderr, "bench peer %s: parent went away: %v\n", role, err)
					os.Exit(1)
				}
				close(pc.cmds)
				return
			}
			pc.busy.Store(true)
			pc.cmds <- m
		}
	}()
	// One thread serves every command, so pinning it holds for the run.
	runtime.LockOSThread()
	if err := body(pc); err != nil {
		return fail(err)
	}
	return 0
}

// segment maps the i-th inherited segment.
func (pc *peerConn) segment(i int, kind uint32, minSize int) (*shm.Segment, error) {
	return shm.OpenSegment(firstSegFd+i, kind, minSize)
}

// next returns the next command, or false when the parent has closed the
// control socket.
func (pc *peerConn) next() (ctlMsg, bool) {
	m, ok := <-pc.cmds
	return m, ok
}

// ready tells the parent that this side is attached and running.
func (pc *peerConn) ready() error { return pc.enc.Encode(ctlMsg{Op: "ready"}) }

// done ends the command; err (may be nil) goes to the parent.
func (pc *peerConn) done(err error) error {
	m := ctlMsg{Op: "done", Preempt: preempted.Swap(0)}
	if err != nil {
		m.Err = err.Error()
	}
	pc.busy.Store(false)
	return pc.enc.Encode(m)
}

// serve runs each command through do, pinned as the parent asks, until the
// parent closes the control socket.
func (pc *peerConn) serve(do func(cmd ctlMsg) error) error {
	for {
		cmd, ok := pc.next()
		if !ok {
			return nil
		}
		var err error
		if cmd.Unpinned {
			err = do(cmd)
		} else {
			err = pinned(cmd.CPU, func() error { return do(cmd) })
		}
		if derr := pc.done(err); derr != nil {
			return fmt.Errorf("answer %s: %w", cmd.Op, derr)
		}
	}
}

// ---- peer tools ----

// The other transports are measured by their own benchmark programs
// (ucx_perftest, fi_pingpong: ucx.go, ofi.go), two processes like ours: the
// server pinned to the peer's CPU, the client, which measures, to this
// process's. The two meet on a loopback TCP port for their set-up only.

const (
	toolListenTimeout = 10 * time.Second // server start until it listens
	toolRunMax        = 3 * time.Minute  // one client run
)

// errToolSkipped says that a peer tool cannot run here, and why.
var errToolSkipped = errors.New("skipped")

// toolPath finds a peer tool: the path in $envName ("0": leave it out), or
// name in PATH. A missing tool is an errToolSkipped error that says which
// Debian package has it.
func toolPath(envName, name, pkg string) (string, error) {
	switch v := os.Getenv(envName); v {
	case "0":
		return "", fmt.Errorf("%w: %s=0", errToolSkipped, envName)
	case "":
	default:
		name = v
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %s not installed (apt-get install %s, or set %s to its path)",
			errToolSkipped, name, pkg, envName)
	}
	return p, nil
}

// A toolPair is one measurement by a peer tool: its server and its client
// on the port they meet on.
type toolPair struct {
	bin    string
	env    []string // added to the environment of both
	server func(port int) []string
	client func(port int) []string
}

// run starts the server, waits until it listens, runs the client and
// returns what the client printed on stdout. Both die with this process.
// A server that exits before it listens is started once more, on another
// port: the free port it was given may have been taken meanwhile.
func (t toolPair) run(ctx context.Context, env *Env) (string, error) {
	out, err := t.runOnce(ctx, env)
	if errors.Is(err, errNotListening) {
		out, err = t.runOnce(ctx, env)
	}
	return out, err
}

// errNotListening: a peer tool's server exited before it listened.
var errNotListening = errors.New("exited before it listened")

func (t toolPair) runOnce(ctx context.Context, env *Env) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, toolRunMax)
	defer cancel()
	port, err := freePort()
	if err != nil {
		return "", err
	}
	name := filepath.Base(t.bin)
	srvOut := &tailBuffer{max: 16 << 10}
	srv := t.command(ctx, t.server(port), srvOut, srvOut)
	if err := spawnOn(srv, env.cpus[1]); err != nil {
		return "", fmt.Errorf("start %s server: %w", name, err)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	defer func() {
		srv.Process.Kill() // it has exited, unless the client failed
		<-srvDone
	}()
	if err := awaitListen(ctx, port, srvDone); err != nil {
		return "", fmt.Errorf("%s server: %w; its output: %s", name, err, lastLines(srvOut.String(), 5))
	}
	var out bytes.Buffer
	cliErr := &tailBuffer{max: 16 << 10}
	cli := t.command(ctx, t.client(port), &out, cliErr)
	if err := spawnOn(cli, env.cpus[0]); err != nil {
		return "", fmt.Errorf("start %s client: %w", name, err)
	}
	if err := cli.Wait(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return "", fmt.Errorf("%s %s: %w; its output: %s; the server's: %s", name, strings.Join(t.client(port), " "),
			err, lastLines(out.String()+cliErr.String(), 5), lastLines(srvOut.String(), 5))
	}
	select {
	case err := <-srvDone:
		srvDone <- err // for the deferred wait
		if err != nil {
			return "", fmt.Errorf("%s server: %w; its output: %s", name, err, lastLines(srvOut.String(), 5))
		}
	case <-time.After(exitTimeout):
		return "", fmt.Errorf("%s server still running %v after its client ended; its output: %s", name,
			exitTimeout, lastLines(srvOut.String(), 5))
	}
	return out.String(), nil
}

func (t toolPair) command(ctx context.Context, args []string, stdout, stderr io.Writer) *exec.Cmd {
	cmd := exec.CommandContext(ctx, t.bin, args...)
	cmd.Env = append(os.Environ(), t.env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// awaitListen waits until a TCP socket listens on port, the server exits
// (done) or toolListenTimeout passes. The tools say nothing when they
// listen (their stdout is block-buffered into a pipe), so the kernel's
// socket table is asked, every millisecond.
func awaitListen(ctx context.Context, port int, done chan error) error {
	deadline := time.NewTimer(toolListenTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := listening(port)
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		}
		select {
		case err := <-done:
			done <- err // for the caller's wait
			return fmt.Errorf("%w on port %d: %v", errNotListening, port, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("not listening on port %d after %v", port, toolListenTimeout)
		case <-tick.C:
		}
	}
}

// listening tells whether /proc/net/tcp or tcp6 has a socket in state
// LISTEN on port.
func listening(port int) (bool, error) {
	suffix := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return false, err
		}
		for line := range strings.Lines(string(b)) {
			// sl local_address rem_address st ...; st 0A is LISTEN.
			if fs := strings.Fields(line); len(fs) > 3 && strings.HasSuffix(fs[1], suffix) && fs[3] == "0A" {
				return true, nil
			}
		}
	}
	return false, nil
}
