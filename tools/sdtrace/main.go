package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/internal/feature"
	"github.com/sandirect/sandirect/internal/sys"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sdtrace:", oneLine(err))
		os.Exit(1)
	}
}

// oneLine folds an error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Environment variables that give flags their defaults.
const (
	envMode     = "SDTRACE_MODE"
	envJSON     = "SDTRACE_JSON"
	envInterval = "SDTRACE_INTERVAL"
	envDuration = "SDTRACE_DURATION"
	envUnit     = "SDTRACE_UNIT"
	envQuiet    = "SDTRACE_QUIET"
	envEvents   = "SDTRACE_EVENTS"
	envRing     = "SDTRACE_RING"
)

// Modes: how the target is traced.
const (
	modeAuto    = "auto"
	modeUprobe  = "uprobe"
	modeSyscall = "syscall"
)

var eventKinds = []string{"register", "deregister", "invalidate", "nic", "sockets", "syscall", "counters"}

const usageHead = `usage: sdtrace [flags] PID
       sdtrace [flags] BINARY PID

Traces a running sandirect process with eBPF, without stopping it:
registrations and registration-cache hits and misses, invalidations with
the system call that caused them, and transfers (nic work requests from
post to completion, sockets Reads and Writes) with sizes and latency. It
prints one line per event, and at the end (and every -interval) a log2
histogram of latencies per operation, like bcc's funclatency.

Modes (-mode):
  uprobe   uprobes at the entry of the library's functions in the target's
           binary (/proc/PID/exe, or BINARY when given: the same file seen
           from here), registers read by Go's amd64 register ABI, plus the
           registration cache monitor's system call probes for the causes
           of invalidations. Needs Linux 5.15, and a binary with its symbol
           table (not built with -ldflags=-s).
  syscall  where uprobes cannot run: the monitor's system call probes
           (munmap, mremap, madvise, brk, mmap MAP_FIXED, shmdt of the
           target: the possible invalidations) and, every -interval (1s
           when 0), the change of the counters the process publishes
           (pin hits and misses, nic operations and bytes, sockets bytes;
           see sdstat).
  auto     uprobe, else syscall (the default).
eBPF needs root, or CAP_BPF with CAP_PERFMON; without them sdtrace says
what is missing and exits 1.

It ends at Ctrl-C (SIGINT, SIGTERM), after -duration, or when the target
exits.

Flags:
`

const usageTail = `
Environment variables (defaults of the flags above):
  SDTRACE_MODE      -mode
  SDTRACE_JSON      -json, as a boolean ("1", "true", …)
  SDTRACE_INTERVAL  -interval, as a Go duration ("5s")
  SDTRACE_DURATION  -duration, as a Go duration
  SDTRACE_UNIT      -unit
  SDTRACE_QUIET     -q, as a boolean
  SDTRACE_EVENTS    -events
  SDTRACE_RING      -ring

Output: a "start" line naming the mode, then one line per event:
  TIME TID KIND OP key=value…; kinds register (hit, miss), deregister,
  invalidate (entry, range, cause=SYSCALL@TID), nic (send, recv,
  rdma-write, rdma-read; bytes, status, lat), sockets (read, write;
  bytes of the length asked for, lat), syscall and counters (syscall mode),
  lost (records dropped by a full ring). With -json every line is a JSON
  object with a "kind" field, the histograms too ("kind":"histogram").

Exit status 1 with one line on stderr on any error.

Examples:
  sdtrace 4242                         # events and, at Ctrl-C, histograms
  sdtrace -q -interval 5s 4242         # histograms every 5 s, like funclatency
  sdtrace -events invalidate,register -json 4242 | jq .
  sdtrace ./server 4242                # the binary as seen from here
`

type options struct {
	pid      int
	bin      string // the target's executable; "" means /proc/PID/exe
	mode     string
	json     bool
	interval time.Duration
	duration time.Duration
	unit     time.Duration
	quiet    bool
	kinds    map[string]bool // nil: every kind
	ring     int
}

type unitFlag struct{ u *time.Duration }

func (f unitFlag) String() string {
	if f.u == nil {
		return "us"
	}
	return map[time.Duration]string{time.Nanosecond: "ns", time.Microsecond: "us", time.Millisecond: "ms"}[*f.u]
}

func (f unitFlag) Set(s string) error {
	switch s {
	case "ns":
		*f.u = time.Nanosecond
	case "us", "µs":
		*f.u = time.Microsecond
	case "ms":
		*f.u = time.Millisecond
	default:
		return fmt.Errorf("want ns, us or ms")
	}
	return nil
}

func parseEvents(s string) (map[string]bool, error) {
	if s == "" || s == "all" {
		return nil, nil
	}
	m := map[string]bool{}
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		ok := false
		for _, w := range eventKinds {
			ok = ok || w == k
		}
		if !ok {
			return nil, fmt.Errorf("unknown event kind %q (want %s)", k, strings.Join(eventKinds, ","))
		}
		m[k] = true
	}
	return m, nil
}

// parseArgs returns the checked options, or nil after -h.
func parseArgs(stdout io.Writer, args []string) (*options, error) {
	o := &options{mode: modeAuto, unit: time.Microsecond, ring: 4 << 20}
	var err error
	env := func(name string, parse func(string) error) error {
		if v := os.Getenv(name); v != "" {
			if err := parse(v); err != nil {
				return fmt.Errorf("%s=%q: %v", name, v, err)
			}
		}
		return nil
	}
	events := ""
	for _, e := range []struct {
		name  string
		parse func(string) error
	}{
		{envMode, func(v string) error { o.mode = v; return nil }},
		{envJSON, func(v string) (err error) { o.json, err = strconv.ParseBool(v); return }},
		{envQuiet, func(v string) (err error) { o.quiet, err = strconv.ParseBool(v); return }},
		{envInterval, func(v string) (err error) { o.interval, err = time.ParseDuration(v); return }},
		{envDuration, func(v string) (err error) { o.duration, err = time.ParseDuration(v); return }},
		{envUnit, unitFlag{&o.unit}.Set},
		{envEvents, func(v string) error { events = v; return nil }},
		{envRing, func(v string) (err error) { o.ring, err = strconv.Atoi(v); return }},
	} {
		if err := env(e.name, e.parse); err != nil {
			return nil, err
		}
	}

	fs := flag.NewFlagSet("sdtrace", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.mode, "mode", o.mode, "how to trace: `MODE` auto, uprobe or syscall (see above)")
	fs.BoolVar(&o.json, "json", o.json, "print JSON objects, one per line")
	fs.DurationVar(&o.interval, "interval", o.interval, "print the histograms (and reset them) every `INTERVAL`; in syscall mode, the counters (0: at the end only; syscall mode 1s)")
	fs.DurationVar(&o.duration, "duration", o.duration, "stop after `DURATION` (0: at Ctrl-C or when the target exits)")
	fs.Var(unitFlag{&o.unit}, "unit", "histogram `UNIT`: ns, us or ms")
	fs.BoolVar(&o.quiet, "q", o.quiet, "no event lines: histograms (and counters) only")
	fs.StringVar(&events, "events", events, "print only events of these `KINDS`, comma-separated: "+strings.Join(eventKinds, ",")+" (default all)")
	fs.IntVar(&o.ring, "ring", o.ring, "ring buffer `BYTES` between the probes and sdtrace: a power of two, at least 4096")
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, usageHead)
				fs.SetOutput(stdout)
				fs.PrintDefaults()
				fs.SetOutput(io.Discard)
				fmt.Fprint(stdout, usageTail)
				return nil, nil
			}
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		rest = append(rest, args[0]) // flags may follow the arguments
		args = args[1:]
	}
	if o.kinds, err = parseEvents(events); err != nil {
		return nil, fmt.Errorf("-events: %v", err)
	}
	switch len(rest) {
	case 0:
		return nil, errors.New("no PID given (see -h)")
	case 1:
	case 2:
		o.bin = rest[0]
	default:
		return nil, fmt.Errorf("unexpected argument %q (see -h)", rest[2])
	}
	if o.pid, err = strconv.Atoi(rest[len(rest)-1]); err != nil || o.pid <= 0 {
		return nil, fmt.Errorf("%q: not a pid", rest[len(rest)-1])
	}
	switch {
	case o.mode != modeAuto && o.mode != modeUprobe && o.mode != modeSyscall:
		return nil, fmt.Errorf("-mode %q: want auto, uprobe or syscall", o.mode)
	case o.interval < 0 || o.duration < 0:
		return nil, errors.New("-interval and -duration must not be negative")
	case o.ring < 4096 || o.ring&(o.ring-1) != 0:
		return nil, fmt.Errorf("-ring %d: want a power of two, at least 4096", o.ring)
	}
	return o, nil
}

// run parses args, traces the process and prints to stdout.
func run(ctx context.Context, stdout io.Writer, args []string) error {
	o, err := parseArgs(stdout, args)
	if err != nil || o == nil {
		return err
	}
	if runtime.GOARCH != "amd64" {
		return fmt.Errorf("the probes read amd64 registers; this is %s", runtime.GOARCH)
	}
	if !alive(o.pid) {
		return fmt.Errorf("no process %d", o.pid)
	}
	exe := o.bin
	if exe == "" {
		exe = "/proc/" + strconv.Itoa(o.pid) + "/exe"
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	p := &printer{w: stdout, json: o.json, quiet: o.quiet, kinds: o.kinds}
	hs := newHistograms(o.unit)

	var uerr error
	if o.mode != modeSyscall {
		var u *uprobes
		u, uerr = attachUprobes(exe, o.pid, o.ring)
		if uerr == nil {
			defer u.close()
			return traceUprobes(ctx, o, p, hs, u)
		}
		if o.mode == modeUprobe {
			return fmt.Errorf("uprobes: %w", uerr)
		}
	}
	mon, merr := openSyscalls(o.pid)
	if merr != nil {
		if errors.Is(merr, os.ErrPermission) && (uerr == nil || errors.Is(uerr, os.ErrPermission)) {
			return &missingError{what: missingPrivilege(), err: os.ErrPermission}
		}
		if uerr != nil {
			return fmt.Errorf("eBPF cannot trace here: uprobes: %v; system call probes: %w", uerr, merr)
		}
		return fmt.Errorf("system call probes: %w", merr)
	}
	defer mon.Close()
	note := ""
	if uerr != nil {
		note = "(no uprobes: " + oneLine(uerr) + ")"
	}
	return traceSyscalls(ctx, o, p, mon, note)
}

// missingError says what this process lacks to run eBPF at all. It
// matches ErrNotSupported.
type missingError struct {
	what string
	err  error
}

func (e *missingError) Error() string {
	return "eBPF cannot run here: missing " + e.what + " (bpf(2): " + e.err.Error() + ")"
}

func (e *missingError) Is(target error) bool { return target == feature.ErrNotSupported }
func (e *missingError) Unwrap() error        { return e.err }

// missingPrivilege names the capabilities that eBPF needs and this
// process lacks.
func missingPrivilege() string {
	admin := sys.HasCap(sys.CapSysAdmin)
	switch {
	case !admin && !sys.HasCap(sys.CapBPF):
		return "CAP_BPF and CAP_PERFMON (or root)"
	case !admin && !sys.HasCap(sys.CapPerfmon):
		return "CAP_PERFMON (or root)"
	}
	return "permission to use bpf(2) (kernel lockdown, or a seccomp or LSM policy)"
}

// checkEvery is how often the loops look at the context and the target
// while no event comes.
const checkEvery = 100 * time.Millisecond

func traceUprobes(ctx context.Context, o *options, p *printer, hs *histograms, u *uprobes) error {
	// The system calls behind invalidations; without them, causes are
	// unknown but everything else works.
	mon, merr := openSyscalls(o.pid)
	note := fmt.Sprintf("pid=%d probes=%d", o.pid, len(u.attached))
	if len(u.missing) > 0 {
		note += " absent=" + strings.Join(u.missing, ",")
	}
	if merr != nil {
		note += " causes=unknown (" + oneLine(merr) + ")"
	} else {
		defer mon.Close()
		note += " causes=" + string(mon.Method())
	}
	if err := p.event(&Event{Time: time.Now(), Kind: "start", Op: modeUprobe, Note: note}); err != nil {
		return err
	}
	c := newCorrelator(newClock(sys.MonotonicNanos), hs, mon)
	var rec ringbuf.Record
	var lost uint64
	nextHist := time.Now().Add(o.interval)
	for {
		now := time.Now()
		deadline := now.Add(checkEvery)
		if o.interval > 0 && nextHist.Before(deadline) {
			deadline = nextHist
		}
		u.rd.SetDeadline(deadline)
		for {
			err := u.rd.ReadInto(&rec)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				return fmt.Errorf("read ring: %w", err)
			}
			r, err := decodeRecord(rec.RawSample)
			if err != nil {
				return err
			}
			if ev := c.handle(&r); ev != nil {
				if err := p.event(ev); err != nil {
					return err
				}
			}
			if time.Now().After(deadline) {
				break
			}
		}
		if n := u.lost(); n != lost {
			if err := p.event(&Event{Time: time.Now(), Kind: "lost", Lost: n - lost, Note: "(ring full: raise -ring)"}); err != nil {
				return err
			}
			lost = n
		}
		done := ctx.Err() != nil || !alive(o.pid)
		if done || (o.interval > 0 && !time.Now().Before(nextHist)) {
			if err := p.hists(hs); err != nil {
				return err
			}
			hs.m = map[string]*hist{}
			nextHist = nextHist.Add(o.interval)
		}
		if done {
			return nil
		}
	}
}

func traceSyscalls(ctx context.Context, o *options, p *printer, mon *bpfmon.Monitor, note string) error {
	interval := o.interval
	if interval == 0 {
		interval = time.Second
	}
	src := &counterSource{pid: o.pid}
	defer src.close()
	src.delta() // the baseline
	head := fmt.Sprintf("pid=%d syscalls=%s", o.pid, mon.Method())
	if note != "" {
		head += " " + note
	}
	if err := p.event(&Event{Time: time.Now(), Kind: "start", Op: modeSyscall, Note: head}); err != nil {
		return err
	}
	next := time.Now().Add(interval)
	var counterErr string
	for {
		deadline := time.Now().Add(checkEvery)
		if next.Before(deadline) {
			deadline = next
		}
		if err := mon.Wait(deadline); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		var perr error
		now := time.Now()
		if _, err := mon.Drain(func(e bpfmon.Event) {
			if perr == nil {
				perr = p.event(syscallEvent(e, now))
			}
		}); err != nil {
			return err
		}
		if perr != nil {
			return perr
		}
		if n := mon.ClearOverflow(); n > 0 {
			if err := p.event(&Event{Time: now, Kind: "lost", Lost: n}); err != nil {
				return err
			}
		}
		done := ctx.Err() != nil || !alive(o.pid)
		if !now.Before(next) || done {
			next = next.Add(interval)
			d, err := src.delta()
			switch {
			case err != nil:
				if msg := oneLine(err); msg != counterErr {
					counterErr = msg
					p.event(&Event{Time: now, Kind: "note", Note: "no counters: " + msg})
				}
			case d != nil:
				if err := p.event(&Event{Time: now, Kind: "counters", Counters: d}); err != nil {
					return err
				}
			}
		}
		if done {
			return nil
		}
	}
}

// alive tells whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	st := s[i+2]
	return st != 'Z' && st != 'X'
}
