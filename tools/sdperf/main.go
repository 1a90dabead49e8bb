package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sdperf:", oneLine(err))
		os.Exit(1)
	}
}

// oneLine folds an error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Environment variables that give flags their defaults.
const (
	envAddr    = "SDPERF_ADDR"
	envDevice  = "SDPERF_DEVICE"
	envIters   = "SDPERF_ITERS"
	envEvents  = "SDPERF_EVENTS"
	envNoRead  = "SDPERF_NO_READ"
	envTimeout = "SDPERF_TIMEOUT"

	defaultAddr    = "@sdperf"
	defaultTimeout = 30 * time.Second
)

// config is one side's command line, checked.
type config struct {
	test    testKind
	sizes   []int
	iters   int
	memory  string // "shm" or "cma"
	events  bool
	noRead  bool
	addr    string // where the server listens or the client dials
	server  bool
	timeout time.Duration // bounds each wait for the peer; 0: none
}

const usageHead = `usage: sdperf TEST [-s SIZE | -a] [-n ITERS] [-d DEVICE] [-e] [--no-read] [ADDRESS]

A perftest-compatible benchmark of sandirect's emulated NIC (package nic).
Without ADDRESS it is the server: it listens (on -addr), prints the address,
serves one run and exits. With ADDRESS it is the client and connects to a
server started with the same TEST, sizes and iterations; both sides check
that at connect and fail with both command lines if they differ.

TEST is one of:
  send_lat    send ping-pong, half round trip
  write_lat   RDMA Write ping-pong (each side polls its buffer's last byte), half round trip
  read_lat    RDMA Read, posted and completed; the whole round trip
  send_bw     sends streamed to the server's posted receives
  write_bw    RDMA Writes into the server's buffer
  read_bw     RDMA Reads from the server's buffer

Output is perftest's: the banner, then for latency
  #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9% (usec)
and for bandwidth
  #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]
with MB = 2^20 bytes. The client prints every table. The server prints the
same table: its own measurements where it takes part in the timing
(send_lat and write_lat: it is the other half of the ping-pong; send_bw:
the rate of its receives, from the first to the last), and the client's
numbers, sent after each size, where it only serves memory (read_lat,
write_bw, read_bw; perftest's server prints no numbers there).

Flags (also accepted after TEST and ADDRESS, with one or two dashes):
`

const usageTail = `
Environment variables (defaults of the flags above):
  SDPERF_ADDR      -addr: the server's listening address (default "@sdperf")
  SDPERF_DEVICE    -d: "shm" or "cma" (default "shm")
  SDPERF_ITERS     -n
  SDPERF_EVENTS    -e, as a boolean ("1", "true", …)
  SDPERF_NO_READ   --no-read, as a boolean
  SDPERF_TIMEOUT   -timeout, as a Go duration ("30s")

Exit status 1 with one line on stderr on any error, including a peer whose
parameters differ and a read test where a device has no RDMA Read.

Examples:
  sdperf write_lat -a                       # server
  sdperf write_lat -a @sdperf               # client, in another shell
  sdperf read_bw -d cma -addr /tmp/sdperf.sock
  sdperf read_bw -d cma /tmp/sdperf.sock
`

// run parses args, runs one side of one test and writes its tables to
// stdout.
func run(ctx context.Context, stdout io.Writer, args []string) error {
	cfg, err := parseArgs(stdout, args)
	if err != nil || cfg == nil {
		return err
	}
	return runTest(ctx, stdout, cfg)
}

// parseArgs returns the checked configuration, or nil after -h.
func parseArgs(stdout io.Writer, args []string) (*config, error) {
	iters, err := envInt(envIters)
	if err != nil {
		return nil, err
	}
	events, err := envBool(envEvents)
	if err != nil {
		return nil, err
	}
	noRead, err := envBool(envNoRead)
	if err != nil {
		return nil, err
	}
	timeout := defaultTimeout
	if v := os.Getenv(envTimeout); v != "" {
		if timeout, err = time.ParseDuration(v); err != nil || timeout < 0 {
			return nil, fmt.Errorf("%s=%q: not a duration ≥ 0", envTimeout, v)
		}
	}
	fs := flag.NewFlagSet("sdperf", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, -h is printed below
	size := fs.Int("s", 0, "message `SIZE` in bytes, 1 … 8388608 (default 2 for *_lat, 65536 for *_bw, as perftest)")
	all := fs.Bool("a", false, "run every size 2^1 … 2^23, as perftest's -a")
	fs.IntVar(&iters, "n", iters, "`ITERS`: iterations per size (default 1000 for *_lat, at least 5; 5000 for *_bw; env "+envIters+")")
	memory := fs.String("d", envOr(envDevice, "shm"), "`DEVICE` memory for this side's buffers: \"shm\", device memory from nic.Device.Alloc, a\nsegment the peer maps, so its RDMA is one copy (the fast path); or \"cma\", ordinary\nprocess memory the peer reaches with process_vm_readv/writev (env "+envDevice+")")
	fs.BoolVar(&events, "e", events, "wait for completions by sleeping (futex) instead of busy polling, as perftest's -e;\nnot with write_lat, which polls memory (env "+envEvents+")")
	fs.BoolVar(&noRead, "no-read", noRead, "open this side's device without RDMA Read (nic.Config.NoRDMARead); read_lat and\nread_bw then fail on both sides, whichever side has it (env "+envNoRead+")")
	addr := fs.String("addr", envOr(envAddr, defaultAddr), "`ADDRESS` the server listens on: a Unix socket path, or @name in the abstract\nnamespace (env "+envAddr+")")
	fs.DurationVar(&timeout, "timeout", timeout, "longest wait for any one step of the peer (a message, a completion, its write);\n0 means none. The server waits for a client, and for the client's run of a\nsize where it only serves memory, without limit (env "+envTimeout+")")
	usage := func() {
		fmt.Fprint(stdout, usageHead)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		fmt.Fprint(stdout, usageTail)
	}
	var pos []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				usage()
				return nil, nil
			}
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	cfg := &config{iters: iters, memory: *memory, events: events, noRead: noRead, addr: *addr, timeout: timeout}
	switch len(pos) {
	case 0:
		return nil, errors.New("no test given: sdperf TEST [flags] [ADDRESS]; see sdperf -h")
	case 1:
		cfg.server = true
	case 2:
		cfg.addr = pos[1]
		if set["addr"] {
			return nil, fmt.Errorf("both -addr %s and ADDRESS %s given", *addr, pos[1])
		}
	default:
		return nil, fmt.Errorf("too many arguments: %q", pos[2:])
	}
	var ok bool
	if cfg.test, ok = parseTest(pos[0]); !ok {
		return nil, fmt.Errorf("unknown test %q: want one of %s", pos[0], strings.Join(testNames[1:], ", "))
	}
	switch {
	case *all && set["s"]:
		return nil, errors.New("-s and -a exclude each other")
	case *all:
		cfg.sizes = allSizes()
	case set["s"]:
		if *size < 1 || *size > maxSize {
			return nil, fmt.Errorf("-s %d: size must be in [1, %d]", *size, maxSize)
		}
		cfg.sizes = []int{*size}
	case cfg.test.lat():
		cfg.sizes = []int{defSizeLat}
	default:
		cfg.sizes = []int{defSizeBW}
	}
	if cfg.iters == 0 && !set["n"] {
		cfg.iters = defItersBW
		if cfg.test.lat() {
			cfg.iters = defItersLat
		}
	}
	switch {
	case cfg.test.lat() && cfg.iters < minItersLat:
		return nil, fmt.Errorf("-n %d: latency tests need at least %d iterations (perftest drops the %d slowest)", cfg.iters, minItersLat, latTail)
	case cfg.iters < 1 || cfg.iters > maxIters:
		return nil, fmt.Errorf("-n %d: iterations must be in [1, %d]", cfg.iters, maxIters)
	case cfg.memory != "shm" && cfg.memory != "cma":
		return nil, fmt.Errorf("-d %q: device must be \"shm\" or \"cma\"", cfg.memory)
	case cfg.events && cfg.test == writeLat:
		return nil, errors.New("-e: write_lat has no event mode: it polls memory for the peer's write (perftest: events not available on WRITE)")
	case cfg.addr == "":
		return nil, errors.New("empty address")
	case cfg.timeout < 0:
		return nil, fmt.Errorf("-timeout %v: must be ≥ 0", cfg.timeout)
	}
	return cfg, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: not an integer", name, v)
	}
	return n, nil
}

func envBool(name string) (bool, error) {
	v := os.Getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: not a boolean", name, v)
	}
	return b, nil
}
