package main

// Suite pin: the registration cache. Register+Deregister of one buffer, the
// same buffer each time as an application that reuses its buffers does,
// with the cache on (pin/cached: a hit after the first miss, no system
// call) and off (pin/uncached: every Register locks the pages, every
// Deregister unlocks them). The buffer is foreign memory (an anonymous
// mapping), watched by the best monitor this process can run. One process:
// registration involves no peer. The number is the whole Register+
// Deregister pair, not half of it.

import (
	"context"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/pin"
)

func init() {
	register(&Suite{
		Name: "pin",
		Doc:  "registration cache: register+deregister of a reused buffer, cached vs uncached",
		Run:  runPin,
		Rows: func(env *Env) int { return 2*len(pinSizes(env)) + 7 },
	})
	targets = append(targets,
		target{"pin uncached 1MiB p50 / cached 1MiB p50",
			recordKey{"pin", "register", "pin/uncached", miB, metricLatP50},
			recordKey{"pin", "register", "pin/cached", miB, metricLatP50}, 100, false, nil},
		target{"pin ebpf hit 4KiB p50 / owned hit 4KiB p50",
			recordKey{"pin", "hit", "pin/ebpf", 4 * kiB, metricLatP50},
			recordKey{"pin", "hit", "pin/owned", 4 * kiB, metricLatP50}, 1.1, true, nil},
		target{"munmap 64KiB with probes p50 / without p50",
			recordKey{"pin", "munmap", "munmap/ebpf", 64 * kiB, metricLatP50},
			recordKey{"pin", "munmap", "munmap/plain", 64 * kiB, metricLatP50}, 1.1, true, nil},
		target{"hosttax: unrelated getppid with a monitor p50 / without p50",
			recordKey{"pin", "hosttax", "hosttax/on", 0, metricLatP50},
			recordKey{"pin", "hosttax", "hosttax/off", 0, metricLatP50}, 1.02, true, nil})
}

func pinSizes(env *Env) []int {
	switch {
	case testTiny:
		return []int{4 * kiB, miB}
	case env.quick:
		return []int{4 * kiB, 64 * kiB, miB, 16 * miB, 64 * miB}
	}
	return pow2Sizes(4*kiB, 64*miB, 4)
}

func runPin(ctx context.Context, env *Env) (recs []Record, err error) {
	// The pinning budget: RLIMIT_MEMLOCK (8 MiB for an unprivileged user
	// on Debian), unless the process may lock any amount.
	budget := pin.DefaultConfig().MaxPinnedBytes
	if c, err := pin.New(&pin.Config{Monitor: pin.MonitorAuto}); err == nil {
		fmt.Fprintf(env.out, "(pin/cached: monitor %v)\n", c.Monitor().Kind)
		c.Close()
	}
	for _, size := range pinSizes(env) {
		if int64(size) > budget {
			fmt.Fprintf(env.out, "(pin %s skipped: more than the %s this process may lock, RLIMIT_MEMLOCK)\n", fsize(size), fsize(int(budget)))
			continue
		}
		buf, err := sys.MapAnon(size)
		if err != nil {
			return recs, err
		}
		for i := 0; i < size; i += 4096 {
			buf[i] = 1 // touched, as a buffer in use is
		}
		for _, mode := range []struct {
			name    string
			monitor pin.MonitorKind
		}{{"pin/cached", pin.MonitorAuto}, {"pin/uncached", pin.MonitorNone}} {
			if err := ctx.Err(); err != nil {
				sys.Munmap(buf)
				return recs, err
			}
			lat, err := pinRegisterLatency(env, buf, mode.monitor)
			if err != nil {
				sys.Munmap(buf)
				return recs, fmt.Errorf("%s %d B: %w", mode.name, size, err)
			}
			recs = append(recs, env.Report(Result{Case: "register", Transport: mode.name, Size: size, Lat: lat})...)
		}
		sys.Munmap(buf)
	}
	r, err := pinEBPF(env)
	recs = append(recs, r...)
	if err != nil {
		return recs, err
	}
	r, err = hostTax(ctx, env)
	return append(recs, r...), err
}

// hostTax measures what an attached monitor costs a process it does not
// watch: getppid (a system call that does nothing) in a loop, with no
// monitor attached (hosttax/off) and with the default eBPF monitor
// attached (hosttax/on) watching another process, a child that sleeps.
// This process is that unrelated one: the probes filter it out as they
// would any other. The two are measured in alternating rounds, the
// monitor attached and detached for each, so that drift falls on both.
func hostTax(ctx context.Context, env *Env) ([]Record, error) {
	// The pin rows before left their cache's monitor idle for the next
	// (pin.SetIdleMonitorLinger): hosttax/off must run with no probe.
	if err := pin.CloseIdleMonitors(); err != nil {
		return nil, fmt.Errorf("hosttax: close the idle monitor: %w", err)
	}
	cfg := bpfmon.DefaultConfig()
	cfg.ExcludeSelf = true
	probe, err := bpfmon.Open(&cfg)
	if err != nil {
		fmt.Fprintf(env.out, "(hosttax skipped: %v)\n", err)
		return nil, nil
	}
	method := probe.Method()
	probe.Close()
	sleeper := exec.CommandContext(ctx, "sleep", "3600")
	if err := sleeper.Start(); err != nil {
		return nil, fmt.Errorf("hosttax: start the watched process: %w", err)
	}
	defer func() {
		sleeper.Process.Kill()
		sleeper.Wait()
	}()
	rounds := 8
	if env.quick || testTiny {
		rounds = 4
	}
	laps := min(env.plan.latMax, 20_000)
	budget := max(env.plan.latTime/4, time.Millisecond)
	type mode struct {
		name    string
		methods []bpfmon.Method // nil: no monitor
		smp     *sampler
	}
	// Beside the default, the generic sys_enter attach that it is
	// preferred to, where the default is not already that.
	modes := []mode{{"hosttax/off", nil, nil}, {"hosttax/on", cfg.Methods, nil}}
	if method == bpfmon.Tracepoint || method == bpfmon.Kprobe {
		modes = append(modes, mode{"hosttax/sys_enter", []bpfmon.Method{bpfmon.TpBtf, bpfmon.RawTracepoint}, nil})
	}
	for i := range modes {
		modes[i].smp = newSampler(laps)
		modes[i].smp.start(0)
	}
	for range rounds {
		for _, md := range modes {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			var m *bpfmon.Monitor
			if md.methods != nil {
				c := cfg
				c.Methods = md.methods
				if m, err = bpfmon.Open(&c); err != nil {
					return nil, fmt.Errorf("hosttax: attach: %w", err)
				}
				if err := m.AddPid(sleeper.Process.Pid); err != nil {
					m.Close()
					return nil, fmt.Errorf("hosttax: %w", err)
				}
			}
			getppidLatency(md.smp, budget/time.Duration(rounds), laps/rounds)
			if m != nil {
				if err := m.Close(); err != nil {
					return nil, fmt.Errorf("hosttax: detach: %w", err)
				}
			}
		}
	}
	fmt.Fprintf(env.out, "(hosttax/on: the monitor attached by %s)\n", method)
	var recs []Record
	for _, m := range modes {
		rt := m.smp.result()
		for i := range rt {
			rt[i] = rt[i] * 2 / getppidBatch // per call, as a round trip
		}
		recs = append(recs, env.Report(Result{Case: "hosttax", Transport: m.name, Lat: summarize(rt)})...)
	}
	return recs, nil
}

// getppidBatch calls make one lap of getppidLatency.
const getppidBatch = 64

// getppidLatency times batches of getppid calls for about budget or laps
// batches, adding to smp's samples.
func getppidLatency(smp *sampler, budget time.Duration, laps int) {
	smp.resume(budget, laps)
	for {
		for range getppidBatch {
			syscall.Getppid()
		}
		if !smp.lap() {
			break
		}
	}
}

// pinEBPF measures what the eBPF monitor costs: a cache hit with its epoch
// check against a hit on owned memory (whose epoch never moves), and
// munmap with the probes attached and the range watched against plain
// munmap. Skipped, with the reason, where eBPF cannot run.
func pinEBPF(env *Env) (recs []Record, err error) {
	c, err := pin.New(&pin.Config{Monitor: pin.MonitorEBPF})
	if err != nil {
		fmt.Fprintf(env.out, "(pin/ebpf skipped: %v)\n", err)
		return nil, nil
	}
	defer c.Close()
	owned, err := pin.New(&pin.Config{Monitor: pin.MonitorOwned})
	if err != nil {
		return nil, err
	}
	defer owned.Close()
	const size = 4 * kiB
	foreign, err := sys.MapAnon(size)
	if err != nil {
		return nil, err
	}
	defer sys.Munmap(foreign)
	mine, err := pin.Alloc(size)
	if err != nil {
		return nil, err
	}
	defer pin.Free(mine)
	// The two are compared as a ratio: measured in alternating rounds, so
	// that the machine's drift (docs/performance.md) falls on both alike.
	hits := []struct {
		name string
		c    *pin.Cache
		buf  []byte
		smp  *sampler
	}{{"pin/ebpf", c, foreign, nil}, {"pin/owned", owned, mine, nil}}
	laps := min(env.plan.latMax, 100_000)
	budget := max(env.plan.latTime/2, time.Millisecond)
	for i := range hits {
		h, err := hits[i].c.Register(hits[i].buf, 0)
		if err != nil {
			return recs, err
		}
		defer hits[i].c.Deregister(h)
		hits[i].smp = newSampler(laps)
		hits[i].smp.start(0)
	}
	for range pinRounds {
		for _, m := range hits {
			hitLatency(m.c, m.buf, m.smp, budget/pinRounds, laps/pinRounds)
		}
	}
	for _, m := range hits {
		rt := m.smp.result()
		for i := range rt {
			rt[i] = rt[i] * 2 / hitBatch // per pair, as a round trip
		}
		recs = append(recs, env.Report(Result{Case: "hit", Transport: m.name, Size: size, Lat: summarize(rt)})...)
	}
	// munmap of a locked range: plain, and registered-and-released with
	// the eBPF monitor (cached, watched: the probe reports it, the cache's
	// drain goroutine applies it); one of each in turn.
	const msize = 64 * kiB
	n := min(env.plan.latMax, 20_000)
	if testTiny {
		n = 200
	}
	unmaps := []struct {
		name    string
		c       *pin.Cache
		samples []int64
	}{{"munmap/plain", nil, make([]int64, 0, n)}, {"munmap/ebpf", c, make([]int64, 0, n)}}
	for range n {
		for i, m := range unmaps {
			b, err := sys.MapAnon(msize)
			if err != nil {
				return recs, err
			}
			b[0], b[msize-1] = 1, 1
			if m.c == nil {
				// Locked like a registered range, so that only the
				// monitor differs.
				if err := sys.Mlock(sys.Addr(b), msize); err != nil {
					return recs, err
				}
			} else {
				h, err := m.c.Register(b, 0)
				if err != nil {
					return recs, err
				}
				m.c.Deregister(h)
			}
			t0 := time.Now()
			sys.Munmap(b)
			unmaps[i].samples = append(unmaps[i].samples, 2*int64(time.Since(t0)))
		}
	}
	for _, m := range unmaps {
		recs = append(recs, env.Report(Result{Case: "munmap", Transport: m.name, Size: msize, Lat: summarize(m.samples)})...)
	}
	return recs, nil
}

// pinRounds is how many alternating rounds the eBPF hit and the owned hit
// are measured in.
const pinRounds = 8

// hitBatch Register+Deregister pairs make one lap of hitLatency: one
// pair is shorter than two clock reads.
const hitBatch = 64

// hitLatency times batches of Register+Deregister pairs that hit for about
// budget or laps batches, adding to smp's samples (per batch).
func hitLatency(c *pin.Cache, buf []byte, smp *sampler, budget time.Duration, laps int) {
	smp.resume(budget, laps)
	for {
		for range hitBatch {
			h, _ := c.Register(buf, 0)
			c.Deregister(h)
		}
		if !smp.lap() {
			break
		}
	}
}

func pinRegisterLatency(env *Env, buf []byte, monitor pin.MonitorKind) (*Latency, error) {
	c, err := pin.New(&pin.Config{Monitor: monitor})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.Monitor() // Auto's starts in the background: foreign memory is cached once it runs
	// Slow (uncached) registrations of large buffers take milliseconds:
	// fewer samples, same time budget.
	smp := newSampler(min(env.plan.latMax, 100_000))
	one := func() error {
		h, err := c.Register(buf, 0)
		if err != nil {
			return err
		}
		return c.Deregister(h)
	}
	for range 10 {
		if err := one(); err != nil {
			return nil, err
		}
	}
	smp.start(max(env.plan.latTime/2, time.Millisecond))
	for {
		if err := one(); err != nil {
			return nil, err
		}
		if !smp.lap() {
			break
		}
	}
	rt := smp.result()
	for i := range rt {
		rt[i] *= 2 // report the whole pair
	}
	return summarize(rt), nil
}
