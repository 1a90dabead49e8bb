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
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/sandirect/sandirect/internal/feature"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/pin"
	"github.com/sandirect/sandirect/sockets"
)

func TestMain(m *testing.M) {
	testutil.RegisterChild("workload", childWorkload)
	testutil.RegisterChild("main", func(args []string) error {
		os.Args = append([]string{"sdtrace"}, args...)
		main()
		return nil
	})
	testutil.RegisterChild("sdtrace-unprivileged", func(args []string) error {
		return run(context.Background(), os.Stdout, args)
	})
	testutil.Main(m, pin.CloseIdleMonitors) // the devices' idle eBPF monitor (pin.SetIdleMonitorLinger)
}

// Sizes of the workload's operations, which the tests look for.
const (
	regSize   = 64 << 10 // the buffer registered twice (a miss, then a hit) and RDMA-written
	sendSize  = 1000     // a send of its first bytes
	unmapSize = 1 << 20  // a registered anonymous mapping, then munmapped
	sockLarge = 256 << 10
	sockSmall = 100
	wrWrite   = 7
	wrSend    = 8
	wrRecv    = 9
)

// round is what the workload child reports after each round.
type round struct {
	RegAddr   uint64 `json:"reg_addr"`
	UnmapAddr uint64 `json:"unmap_addr"`
}

// childWorkload is a sandirect program: two nic devices joined by a queue
// pair, and a sockets connection to itself. For every line read from fd 3
// it runs a round of operations — registers a buffer (miss), deregisters
// and registers it again (hit), RDMA-writes it, sends part of it, registers
// an anonymous mapping and munmaps it, writes and reads over sockets — and
// reports the addresses on fd 4.
func childWorkload([]string) error {
	cmds := bufio.NewScanner(os.NewFile(3, "cmd"))
	report := os.NewFile(4, "report")
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
	// The registration monitors start in the background: the rounds'
	// munmaps must find them attached.
	a.Cache().Monitor()
	b.Cache().Monitor()
	ln, err := b.Listen(fmt.Sprintf("@sdtrace-test-%d", os.Getpid()))
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

	sln, err := sockets.Listen("sandirect", fmt.Sprintf("@sdtrace-test-sock-%d", os.Getpid()))
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

	// Remote and receive buffers on b.
	rbuf := make([]byte, regSize)
	rmr, err := b.RegisterRemote(rbuf, nic.AccessRemoteWrite|nic.AccessLocalWrite)
	if err != nil {
		return err
	}
	recvBuf := make([]byte, 4096)
	recvMR, err := b.Register(recvBuf, nic.AccessLocalWrite)
	if err != nil {
		return err
	}
	wait := func(cq *nic.CompletionQueue) error {
		var c [1]nic.Completion
		n, err := cq.Wait(c[:], time.Now().Add(10*time.Second))
		if err == nil && (n != 1 || c[0].Status != nic.StatusSuccess) {
			err = fmt.Errorf("completion %+v", c[0])
		}
		return err
	}
	fmt.Fprintln(report, "ready")
	for cmds.Scan() {
		// A fresh buffer each round: a miss, then a hit.
		buf := make([]byte, regSize)
		mr, err := a.Register(buf, 0)
		if err != nil {
			return err
		}
		if err := a.Deregister(mr); err != nil {
			return err
		}
		if mr, err = a.Register(buf, 0); err != nil {
			return err
		}
		if err := aqp.PostSend(nic.SendWR{ID: wrWrite, Op: nic.OpWrite, Local: buf, LKey: mr.LKey, Remote: uint64(rmr.Addr), RKey: rmr.RKey}); err != nil {
			return err
		}
		if err := wait(acq); err != nil {
			return err
		}
		if err := bqp.PostRecv(nic.RecvWR{ID: wrRecv, Buf: recvBuf, LKey: recvMR.LKey}); err != nil {
			return err
		}
		if err := aqp.PostSend(nic.SendWR{ID: wrSend, Op: nic.OpSend, Local: buf[:sendSize], LKey: mr.LKey}); err != nil {
			return err
		}
		if err := wait(acq); err != nil {
			return err
		}
		if err := wait(bcq); err != nil {
			return err
		}
		a.Deregister(mr)

		// A registered mapping that goes away.
		m, err := sys.MmapAnon(0, unmapSize, 0)
		if err != nil {
			return err
		}
		mb := sys.Bytes(m, unmapSize)
		mb[0] = 1
		umr, err := a.Register(mb, 0)
		if err != nil {
			return err
		}
		a.Deregister(umr) // cached, until the munmap
		if err := sys.MunmapRange(m, unmapSize); err != nil {
			return err
		}

		// Sockets: a rendezvous-sized write and a small one.
		got := make(chan error, 1)
		go func() {
			_, err := io.ReadFull(ss, make([]byte, sockLarge+sockSmall))
			got <- err
		}()
		if _, err := sc.Write(make([]byte, sockLarge)); err != nil {
			return err
		}
		if _, err := sc.Write(make([]byte, sockSmall)); err != nil {
			return err
		}
		if err := <-got; err != nil {
			return err
		}
		j, _ := json.Marshal(round{RegAddr: uint64(sys.Addr(buf)), UnmapAddr: uint64(m)})
		fmt.Fprintf(report, "%s\n", j)
	}
	return cmds.Err()
}

// workload is a running workload child and its pipes.
type workload struct {
	child  *testutil.Child
	cmd    *os.File
	report *bufio.Reader
	rfile  *os.File
}

func startWorkload(t *testing.T) *workload {
	t.Helper()
	cr, cw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	rr, rw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c := testutil.StartChild(t, "workload", []*os.File{cr, rw})
	cr.Close()
	rw.Close()
	w := &workload{child: c, cmd: cw, report: bufio.NewReader(rr), rfile: rr}
	t.Cleanup(func() {
		cw.Close()
		rr.Close()
	})
	if line := w.line(t); line != "ready" {
		t.Fatalf("workload: %q", line)
	}
	return w
}

// line reads the child's next report line, failing after 30 s.
func (w *workload) line(t *testing.T) string {
	t.Helper()
	w.rfile.SetReadDeadline(time.Now().Add(30 * time.Second))
	s, err := w.report.ReadString('\n')
	if err != nil {
		t.Fatalf("workload report: %v; output:\n%s", err, w.child.Output())
	}
	return strings.TrimSpace(s)
}

// round runs one round of the workload and returns its addresses.
func (w *workload) round(t *testing.T) round {
	t.Helper()
	if _, err := fmt.Fprintln(w.cmd, "go"); err != nil {
		t.Fatal(err)
	}
	var r round
	if err := json.Unmarshal([]byte(w.line(t)), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// lines collects what a running sdtrace prints, one line at a time.
type lines struct {
	mu   sync.Mutex // guards buf, all
	buf  []byte
	all  []string
	note chan struct{} // a line arrived
}

func newLines() *lines { return &lines{note: make(chan struct{}, 1)} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.all = append(l.all, string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	l.mu.Unlock()
	select {
	case l.note <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (l *lines) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.all...)
}

// waitFor waits until some line satisfies match, failing after 30 s.
func (l *lines) waitFor(t *testing.T, what string, match func(string) bool) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		for _, s := range l.snapshot() {
			if match(s) {
				return s
			}
		}
		select {
		case <-l.note:
		case <-timeout:
			t.Fatalf("no %s within 30 s; sdtrace printed:\n%s", what, strings.Join(l.snapshot(), "\n"))
		}
	}
}

// sdtrace starts the tool on pid in the background; stop ends it and
// returns its error.
func sdtrace(t *testing.T, args ...string) (out *lines, stop func() error) {
	t.Helper()
	out = newLines()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, out, args) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = errors.New("sdtrace did not stop within 30 s")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	// Started, or failed.
	for {
		for _, s := range out.snapshot() {
			if strings.Contains(s, "start") {
				return out, stop
			}
		}
		select {
		case <-out.note:
		case err := <-done:
			done <- err
			if errors.Is(err, feature.ErrNotSupported) {
				skipOrFail(t, err)
			}
			t.Fatalf("sdtrace %v: %v", args, err)
		case <-time.After(30 * time.Second):
			t.Fatal("sdtrace did not start within 30 s")
		}
	}
}

// envRequire: when set (CI, as root), a test that would skip because eBPF
// cannot run here fails instead.
const envRequire = "SANDIRECT_REQUIRE_EBPF"

func skipOrFail(t *testing.T, err error) {
	t.Helper()
	if os.Getenv(envRequire) != "" {
		t.Fatalf("eBPF required (%s=%s) but: %v", envRequire, os.Getenv(envRequire), err)
	}
	t.Skipf("skip: %v", err)
}

func decodeEvents(t *testing.T, ls []string) []Event {
	t.Helper()
	var evs []Event
	for _, s := range ls {
		var e Event
		if err := json.Unmarshal([]byte(s), &e); err != nil {
			t.Fatalf("bad JSON line %q: %v", s, err)
		}
		evs = append(evs, e)
	}
	return evs
}

// jsonMatch waits for a JSON event that satisfies match.
func jsonMatch(t *testing.T, out *lines, what string, match func(e *Event) bool) Event {
	t.Helper()
	var got Event
	out.waitFor(t, what, func(s string) bool {
		var e Event
		if json.Unmarshal([]byte(s), &e) != nil || !match(&e) {
			return false
		}
		got = e
		return true
	})
	return got
}

func overlaps(r *Range, addr, n uint64) bool {
	return r != nil && r.Addr < addr+n && addr < r.Addr+r.Len
}

// TestUprobes traces a live workload with uprobes and finds every kind of
// event with the right sizes, addresses and causes, then the histograms.
func TestUprobes(t *testing.T) {
	w := startWorkload(t)
	pid := strconv.Itoa(w.child.Cmd.Process.Pid)
	out, stop := sdtrace(t, "-mode", "uprobe", "-json", pid)
	start := decodeEvents(t, out.snapshot()[:1])[0]
	if start.Kind != "start" || start.Op != "uprobe" || !strings.Contains(start.Note, fmt.Sprintf("probes=%d", len(probes))) {
		t.Errorf("start: %+v", start)
	}
	r := w.round(t)

	miss := jsonMatch(t, out, "register miss of the buffer", func(e *Event) bool {
		return e.Kind == "register" && e.Op == "miss" && e.Addr == r.RegAddr
	})
	if miss.Len != regSize {
		t.Errorf("miss: len %d, want %d", miss.Len, regSize)
	}
	hit := jsonMatch(t, out, "register hit of the buffer", func(e *Event) bool {
		return e.Kind == "register" && e.Op == "hit" && e.Addr == r.RegAddr
	})
	if hit.Len != regSize || !overlaps(hit.Entry, r.RegAddr, regSize) || hit.Entry.Len < regSize || hit.LatencyNS <= 0 {
		t.Errorf("hit: %+v entry %v", hit, hit.Entry)
	}
	for _, how := range []string{"miss", "hit"} {
		e := jsonMatch(t, out, "nic register, cache "+how, func(e *Event) bool {
			return e.Kind == "nic" && e.Op == "register" && e.Addr == r.RegAddr && e.Cache == how
		})
		if e.Len != regSize || e.LKey == 0 || e.LatencyNS <= 0 {
			t.Errorf("nic register (cache %s): %+v", how, e)
		}
	}
	dereg := jsonMatch(t, out, "deregister of the buffer", func(e *Event) bool {
		return e.Kind == "deregister" && e.Addr == r.RegAddr
	})
	if dereg.Len != regSize || !overlaps(dereg.Entry, r.RegAddr, regSize) || dereg.Entry.Len < regSize {
		t.Errorf("deregister: %+v entry %v", dereg, dereg.Entry)
	}
	inv := jsonMatch(t, out, "invalidation of the munmapped mapping", func(e *Event) bool {
		return e.Kind == "invalidate" && overlaps(e.Entry, r.UnmapAddr, unmapSize)
	})
	if inv.Cause != "munmap" || inv.Range == nil || inv.Range.Addr != r.UnmapAddr || inv.Range.Len != unmapSize || !inv.Unmapped {
		t.Errorf("invalidation: %+v range %v, want cause munmap of [%#x,+%#x)", inv, inv.Range, r.UnmapAddr, unmapSize)
	}
	for _, c := range []struct {
		op    string
		wr    uint64
		bytes int64
	}{{"rdma-write", wrWrite, regSize}, {"send", wrSend, sendSize}, {"recv", wrRecv, sendSize}} {
		e := jsonMatch(t, out, "nic "+c.op, func(e *Event) bool { return e.Kind == "nic" && e.Op == c.op && e.WR == c.wr })
		if e.Bytes != c.bytes || e.Status != "success" || e.LatencyNS <= 0 || e.QP == 0 {
			t.Errorf("nic %s: %+v, want %d bytes, success, a latency", c.op, e, c.bytes)
		}
	}
	for _, n := range []int64{sockLarge, sockSmall} {
		e := jsonMatch(t, out, fmt.Sprintf("sockets write of %d", n), func(e *Event) bool {
			return e.Kind == "sockets" && e.Op == "write" && e.Requested == n
		})
		if e.Bytes != n || e.Failed || e.LatencyNS <= 0 {
			t.Errorf("sockets write: %+v", e)
		}
	}
	jsonMatch(t, out, "sockets read", func(e *Event) bool {
		return e.Kind == "sockets" && e.Op == "read" && e.Bytes > 0 && e.LatencyNS > 0
	})

	// The histograms at the end: one per operation timed.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	hists := map[string]uint64{}
	for _, e := range out.snapshot() {
		var h jsonHist
		if json.Unmarshal([]byte(e), &h) == nil && h.Kind == "histogram" {
			var sum uint64
			for _, b := range h.Buckets {
				sum += b.Count
			}
			if sum != h.Count || h.Unit != "usecs" {
				t.Errorf("histogram %s: buckets add up to %d of %d, unit %s", h.Op, sum, h.Count, h.Unit)
			}
			hists[h.Op] = h.Count
		}
	}
	for _, op := range []string{"register hit", "nic register (cache miss)", "nic register (cache hit)", "nic rdma-write", "nic send", "nic recv", "sockets write", "sockets read"} {
		if hists[op] == 0 {
			t.Errorf("no histogram for %s: %v", op, hists)
		}
	}
}

// TestText: the text stream and the funclatency-style histogram.
func TestText(t *testing.T) {
	w := startWorkload(t)
	pid := strconv.Itoa(w.child.Cmd.Process.Pid)
	out, stop := sdtrace(t, "-mode", "uprobe", pid)
	r := w.round(t)
	out.waitFor(t, "the invalidation line", func(s string) bool {
		return strings.Contains(s, " invalidate ") && strings.Contains(s, "cause=munmap@") &&
			strings.Contains(s, fmt.Sprintf("range=[%#x,+%#x)", r.UnmapAddr, unmapSize))
	})
	out.waitFor(t, "the rdma-write line", func(s string) bool {
		return strings.Contains(s, " nic ") && strings.Contains(s, "rdma-write") && strings.Contains(s, fmt.Sprintf("bytes=%d ", regSize))
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(out.snapshot(), "\n")
	for _, want := range []string{"nic rdma-write\n", "usecs : count     distribution", "|****"} {
		if !strings.Contains(strings.Join(strings.Fields(text), " ")+"\n", strings.Join(strings.Fields(want), " ")) {
			t.Errorf("no %q in:\n%s", want, text)
		}
	}
	t.Logf("sdtrace output (excerpt):\n%s", excerpt(text, 40))
}

// TestSyscallMode: the fallback sees the munmap of the registered mapping
// and the counters moving.
func TestSyscallMode(t *testing.T) {
	w := startWorkload(t)
	pid := strconv.Itoa(w.child.Cmd.Process.Pid)
	out, stop := sdtrace(t, "-mode", "syscall", "-json", "-interval", "50ms", pid)
	r := w.round(t)
	jsonMatch(t, out, "the munmap", func(e *Event) bool {
		return e.Kind == "syscall" && e.Op == "munmap" && e.Addr == r.UnmapAddr && e.Len == unmapSize && e.Tid != 0
	})
	// The counters move: their changes, added up over the lines, account
	// for the round's operations.
	w.round(t)
	sum := map[string]int64{}
	jsonMatch(t, out, "counters adding up to the rounds' misses, hits, rdma writes and sockets bytes", func(e *Event) bool {
		if e.Kind != "counters" {
			return false
		}
		for k, v := range e.Counters {
			if v == 0 {
				t.Errorf("counters line with a zero change of %s: %+v", k, e.Counters)
			}
			sum[k] += v
		}
		return sum["pin_misses"] >= 2 && sum["pin_hits"] >= 1 && sum["nic_writes"] >= 1 &&
			sum["nic_bytes"] >= regSize && sum["sockets_bytes_read"] >= sockLarge+sockSmall
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestAutoFallback: in auto mode, a binary without the library's functions
// (here one named on the command line) leaves the system call probes and
// the counters, and the start line says why.
func TestAutoFallback(t *testing.T) {
	w := startWorkload(t)
	pid := strconv.Itoa(w.child.Cmd.Process.Pid)
	out, stop := sdtrace(t, "-json", foreignBinary(t), pid)
	start := decodeEvents(t, out.snapshot()[:1])[0]
	if start.Op != "syscall" || !strings.Contains(start.Note, "no uprobes") || !strings.Contains(start.Note, "no sandirect functions") {
		t.Errorf("start: %+v", start)
	}
	r := w.round(t)
	jsonMatch(t, out, "the munmap", func(e *Event) bool {
		return e.Kind == "syscall" && e.Op == "munmap" && e.Addr == r.UnmapAddr && e.Len == unmapSize
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestFilters: -events keeps only the kinds named, -q only the
// histograms; two tracers of one process at once.
func TestFilters(t *testing.T) {
	w := startWorkload(t)
	pid := strconv.Itoa(w.child.Cmd.Process.Pid)
	nicOnly, stopNic := sdtrace(t, "-mode", "uprobe", "-json", "-events", "nic,invalidate", pid)
	quiet, stopQuiet := sdtrace(t, "-mode", "uprobe", "-json", "-q", pid)
	r := w.round(t)
	jsonMatch(t, nicOnly, "the invalidation", func(e *Event) bool {
		return e.Kind == "invalidate" && overlaps(e.Entry, r.UnmapAddr, unmapSize)
	})
	jsonMatch(t, nicOnly, "the rdma-write", func(e *Event) bool { return e.Kind == "nic" && e.Op == "rdma-write" })
	if err := errors.Join(stopNic(), stopQuiet()); err != nil {
		t.Fatal(err)
	}
	kinds := func(out *lines) map[string]int {
		m := map[string]int{}
		for _, s := range out.snapshot() {
			var e struct{ Kind string }
			if err := json.Unmarshal([]byte(s), &e); err != nil {
				t.Fatalf("bad JSON line %q: %v", s, err)
			}
			m[e.Kind]++
		}
		return m
	}
	for k := range kinds(nicOnly) {
		if k != "start" && k != "nic" && k != "invalidate" && k != "histogram" {
			t.Errorf("-events nic,invalidate printed a %s event", k)
		}
	}
	q := kinds(quiet)
	if q["histogram"] == 0 || len(q) != 2 || q["start"] != 1 {
		t.Errorf("-q printed %v, want a start line and histograms", q)
	}
}

// foreignBinary returns an executable without the library's functions:
// /bin/sh where there is one (an ELF file without Go's tables), else a
// script.
func foreignBinary(t *testing.T) string {
	if _, err := os.Stat("/bin/sh"); err == nil {
		return "/bin/sh"
	}
	return notELF(t)
}

func notELF(t *testing.T) string {
	p := t.TempDir() + "/script"
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTargetExit: sdtrace ends, with its histograms, when the target dies.
func TestTargetExit(t *testing.T) {
	w := startWorkload(t)
	pid := strconv.Itoa(w.child.Cmd.Process.Pid)
	out := newLines()
	done := make(chan error, 1)
	go func() { done <- run(context.Background(), out, []string{"-mode", "uprobe", pid}) }()
	out.waitFor(t, "the start line", func(s string) bool { return strings.Contains(s, " start ") })
	w.round(t)
	out.waitFor(t, "an event", func(s string) bool { return strings.Contains(s, " nic ") })
	w.child.Kill()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sdtrace did not end with its target")
	}
	if text := strings.Join(out.snapshot(), "\n"); !strings.Contains(text, "distribution") {
		t.Errorf("no histogram at the end:\n%s", text)
	}
}

// TestUnprivileged: without CAP_BPF sdtrace exits 1 with one line that
// names what is missing.
func TestUnprivileged(t *testing.T) {
	if sys.Geteuid() != 0 {
		t.Skip("skip: needs root to start a child as nobody")
	}
	w := startWorkload(t)
	pid := strconv.Itoa(w.child.Cmd.Process.Pid)
	c := testutil.StartChildAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "main", nil, pid)
	err := c.Wait(30 * time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1", err)
	}
	out := c.Output()
	if !strings.HasPrefix(out, "sdtrace: ") || strings.Count(out, "\n") != 1 || !strings.Contains(out, "missing CAP_BPF and CAP_PERFMON (or root)") {
		t.Errorf("stderr is not one line naming CAP_BPF: %q", out)
	}
}

// TestExitStatus runs the real main: an error is one line on stderr and
// exit status 1; -h succeeds.
func TestExitStatus(t *testing.T) {
	c := testutil.StartChild(t, "main", nil, "999999999")
	err := c.Wait(20 * time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1", err)
	}
	if out := c.Output(); out != "sdtrace: no process 999999999\n" {
		t.Errorf("stderr: %q", out)
	}
	c = testutil.StartChild(t, "main", nil, "-h")
	if err := c.Wait(20 * time.Second); err != nil {
		t.Fatalf("-h: %v", err)
	}
}

func TestArgs(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string // substring of the error; "" for success
	}{
		{name: "help", args: []string{"-h"}},
		{name: "no pid", args: nil, want: "no PID"},
		{name: "bad pid", args: []string{"me"}, want: "not a pid"},
		{name: "too many", args: []string{"a", "b", "c"}, want: `unexpected argument "c"`},
		{name: "bad mode", args: []string{"-mode", "kprobe", self}, want: "want auto, uprobe or syscall"},
		{name: "bad unit", args: []string{"-unit", "s", self}, want: "ns, us or ms"},
		{name: "bad events", args: []string{"-events", "nic,bogus", self}, want: `unknown event kind "bogus"`},
		{name: "bad ring", args: []string{"-ring", "5000", self}, want: "power of two"},
		{name: "negative interval", args: []string{"-interval", "-1s", self}, want: "negative"},
		{name: "bad env mode", env: map[string]string{envMode: "x"}, args: []string{self}, want: "want auto"},
		{name: "bad env json", env: map[string]string{envJSON: "perhaps"}, args: []string{self}, want: "SDTRACE_JSON"},
		{name: "bad env interval", env: map[string]string{envInterval: "soon"}, args: []string{self}, want: "SDTRACE_INTERVAL"},
		{name: "no symbols", args: []string{"-mode", "uprobe", foreignBinary(t), self}, want: "no sandirect functions"},
		{name: "not ELF", args: []string{"-mode", "uprobe", notELF(t), self}, want: "not an ELF executable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var out bytes.Buffer
			err := run(context.Background(), &out, c.args)
			if (c.name == "no symbols" || c.name == "not ELF") && errors.Is(err, feature.ErrNotSupported) {
				skipOrFail(t, err)
			}
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one with %q", err, c.want)
			}
			if c.name == "help" {
				for _, w := range []string{"-mode MODE", "-json", "-interval INTERVAL", "-duration DURATION", "-unit UNIT", "-q", "-events KINDS", "-ring BYTES",
					envMode, envJSON, envInterval, envDuration, envUnit, envQuiet, envEvents, envRing} {
					if !strings.Contains(out.String(), w) {
						t.Errorf("-h does not mention %s", w)
					}
				}
			}
		})
	}
}

// TestRecordLayout checks the Go offsets of a record against struct event
// as bpf2go read it from the object's BTF.
func TestRecordLayout(t *testing.T) {
	var e sdtraceEvent
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"ts", unsafe.Offsetof(e.Ts), offTS},
		{"cookie", unsafe.Offsetof(e.Cookie), offCookie},
		{"g", unsafe.Offsetof(e.G), offG},
		{"tid", unsafe.Offsetof(e.Tid), offTid},
		{"copied", unsafe.Offsetof(e.Copied), offCopied},
		{"regs", unsafe.Offsetof(e.Regs), offRegs},
		{"deref", unsafe.Offsetof(e.Deref), offDeref},
		{"stack", unsafe.Offsetof(e.Stack), offStack},
		{"size", unsafe.Sizeof(e), recordSize},
	} {
		if c.got != c.want {
			t.Errorf("event %s at %d, Go reads it at %d", c.name, c.got, c.want)
		}
	}
	if _, err := decodeRecord(make([]byte, recordSize-1)); err == nil {
		t.Error("a short record decodes")
	}
}

func TestHistogramBuckets(t *testing.T) {
	for _, c := range []struct {
		v    uint64
		want int
	}{{0, 0}, {1, 0}, {2, 1}, {3, 1}, {4, 2}, {1023, 9}, {1024, 10}} {
		if got := bucket(c.v); got != c.want {
			t.Errorf("bucket(%d) = %d, want %d", c.v, got, c.want)
		}
		lo, hi := bucketRange(bucket(c.v))
		if c.v < lo || c.v > hi {
			t.Errorf("%d outside its bucket [%d, %d]", c.v, lo, hi)
		}
	}
}

func excerpt(s string, lines int) string {
	l := strings.SplitN(s, "\n", lines+1)
	return strings.Join(l[:min(lines, len(l))], "\n")
}

// TestABI checks the register assignment of struct arguments against the
// rules of Go's internal ABI (the end-to-end tests check it against the
// compiler's on the real work requests).
func TestABI(t *testing.T) {
	type small struct {
		ID    uint64
		Op    uint8
		Local []byte
	}
	a := newStructArg(small{}, 1)
	if !a.inRegs {
		t.Fatal("a 5-word struct after a receiver is not in registers")
	}
	for _, c := range []struct {
		name string
		word int
		reg  int
	}{{"ID", 0, rBX}, {"Op", 0, rCX}, {"Local", 0, rDI}, {"Local", 1, rSI}} {
		if l := a.loc(c.name, c.word); !l.inReg || l.reg != c.reg {
			t.Errorf("%s word %d: %+v, want register %d", c.name, c.word, l, c.reg)
		}
	}
	type big struct {
		A, B, C, D uint64
		S          []byte
		E          bool
	}
	b := newStructArg(big{}, 1) // 1 + 8 words fits exactly: 9
	if !b.inRegs {
		t.Error("1 + 8 words not in registers")
	}
	b = newStructArg(big{}, 2) // 10 words: on the stack, as in memory
	if l := b.loc("S", 1); b.inRegs || l.inReg || l.off != 40 {
		t.Errorf("10 words: inRegs %v, S.len at %+v, want stack offset 40", b.inRegs, l)
	}
	type float struct {
		X float64
		N int
	}
	if newStructArg(float{}, 1).inRegs {
		t.Error("a struct with a float counted as integer registers")
	}
}
