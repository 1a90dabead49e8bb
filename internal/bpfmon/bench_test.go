package bpfmon

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// benchMonitor opens a Monitor attached with meth, or skips.
func benchMonitor(b *testing.B, meth Method, cfg Config) *Monitor {
	b.Helper()
	cfg.Methods = []Method{meth}
	m, err := Open(&cfg)
	if errors.Is(err, ErrNotSupported) {
		b.Skipf("skip: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkMunmap measures munmap of a populated 4 KiB or 64 KiB mapping, without
// probes and with each attach method, the range watched (an event is
// reported) or not (filtered out by the granule map). ns/op is the
// mmap+munmap pair; munmap-ns is munmap alone, munmap-p50-ns its median.
func BenchmarkMunmap(b *testing.B) {
	for _, size := range []uintptr{4 << 10, 64 << 10} {
		b.Run("size="+strconv.Itoa(int(size>>10))+"KiB", func(b *testing.B) { benchMunmap(b, size) })
	}
}

func benchMunmap(b *testing.B, size uintptr) {
	run := func(b *testing.B, m *Monitor, watched bool) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if m != nil && watched {
			m.WatchAll(true)
			defer m.WatchAll(false)
		}
		var inMunmap time.Duration
		lats := make([]time.Duration, 0, 1<<16)
		n := 0
		for b.Loop() {
			a, err := sys.MmapAnon(0, size, sys.MapPopulate)
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			sys.MunmapRange(a, size)
			d := time.Since(t0)
			inMunmap += d
			if len(lats) < cap(lats) {
				lats = append(lats, d)
			}
			if n++; m != nil && n%1024 == 0 {
				m.Drain(func(Event) {})
			}
		}
		slices.Sort(lats)
		b.ReportMetric(float64(inMunmap.Nanoseconds())/float64(n), "munmap-ns")
		// The median resists the noise of a shared machine better.
		b.ReportMetric(float64(lats[len(lats)/2].Nanoseconds()), "munmap-p50-ns")
		if m != nil && m.ClearOverflow() != 0 {
			b.Logf("events lost: the ring was too small for the drain interval")
		}
	}
	b.Run("probes=none", func(b *testing.B) { run(b, nil, false) })
	for _, meth := range Methods() {
		for _, watched := range []bool{false, true} {
			name := "probes=" + string(meth) + "/watched=no"
			if watched {
				name = "probes=" + string(meth) + "/watched=yes"
			}
			b.Run(name, func(b *testing.B) { run(b, benchMonitor(b, meth, Config{}), watched) })
		}
	}
}

// BenchmarkGetpid measures a system call the probes do not report: the
// price the one-program methods (tp_btf, raw_tracepoint, on every system
// call of the machine) put on everything else.
func BenchmarkGetpid(b *testing.B) {
	run := func(b *testing.B) {
		for b.Loop() {
			syscall.Getpid()
		}
	}
	b.Run("probes=none", run)
	for _, meth := range Methods() {
		b.Run("probes="+string(meth), func(b *testing.B) {
			benchMonitor(b, meth, Config{})
			run(b)
		})
	}
}

// BenchmarkHostTax measures what an attached monitor costs a process it
// does not watch, the rest of the host: a child process, which no monitor
// watches, times b.N getppid calls, in rounds that alternate between no
// monitor attached in this process and one attached by each method, so
// that a machine whose speed drifts (a VM under TCG) moves them alike.
// Metrics: the median time of a call per mode (none-ns, kprobe-ns, …) and
// the median over the rounds of its ratio to none's in the same round
// (kprobe-x, …). Where kprobes exist, the six calls'
// entries are all that is probed, and getppid is not among them; the
// syscall tracepoints put every task of the machine on the kernel's
// traced system call path.
func BenchmarkHostTax(b *testing.B) {
	const rounds = 9
	child := func() float64 {
		out, err := os.CreateTemp(b.TempDir(), "hosttax")
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		c := testutil.StartChild(b, "getppid-loop", []*os.File{out}, strconv.Itoa(b.N))
		if err := c.Wait(10 * time.Minute); err != nil {
			b.Fatal(err)
		}
		got, err := os.ReadFile(out.Name())
		if err != nil {
			b.Fatal(err)
		}
		ns, err := strconv.ParseFloat(strings.TrimSpace(string(got)), 64)
		if err != nil {
			b.Fatalf("child's getppid time %q: %v", got, err)
		}
		return ns
	}
	modes := append([]Method{""}, Methods()...) // "": none attached
	ns := make(map[Method][]float64)
	ratios := make(map[Method][]float64)
	for range rounds {
		var none float64
		for _, meth := range modes {
			var m *Monitor
			if meth != "" {
				var err error
				if m, err = Open(&Config{Methods: []Method{meth}}); errors.Is(err, ErrNotSupported) {
					continue
				} else if err != nil {
					b.Fatal(err)
				}
			}
			v := child()
			ns[meth] = append(ns[meth], v)
			if m != nil {
				m.Close()
				ratios[meth] = append(ratios[meth], v/none)
			} else {
				none = v
			}
		}
	}
	median := func(v []float64) float64 {
		slices.Sort(v)
		return v[len(v)/2]
	}
	b.ReportMetric(median(ns[""]), "none-ns")
	for _, meth := range Methods() {
		if v := ns[meth]; len(v) > 0 {
			b.ReportMetric(median(v), string(meth)+"-ns")
			b.ReportMetric(median(ratios[meth]), string(meth)+"-x")
		}
	}
}

// childGetppidLoop calls getppid args[0] times on a locked thread and
// writes the mean time of a call, in ns, to fd 3 (BenchmarkHostTax).
func childGetppidLoop(args []string) error {
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 {
		return fmt.Errorf("getppid-loop: count %q", args[0])
	}
	runtime.LockOSThread()
	t0 := time.Now()
	for range n {
		syscall.Getppid()
	}
	ns := float64(time.Since(t0).Nanoseconds()) / float64(n)
	_, err = fmt.Fprintf(os.NewFile(3, "out"), "%.2f\n", ns)
	return err
}

// BenchmarkDelivery measures how an event reaches the reader after munmap
// has returned: sync, by Sync called right away (what a cache lookup does
// when the epoch moved); wake, by a goroutine blocked in Wait (what a
// background drainer sees), as p50 and p99.
func BenchmarkDelivery(b *testing.B) {
	m := benchMonitor(b, TpBtf, Config{})
	m.WatchAll(true)
	b.Cleanup(func() { m.WatchAll(false) })
	const size = 16 << 10

	b.Run("path=sync", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var total time.Duration
		n := 0
		for b.Loop() {
			a, _ := sys.MmapAnon(0, size, 0)
			sys.MunmapRange(a, size)
			t0 := time.Now()
			found := false
			if _, err := m.Sync(func(e Event) { found = found || e.Start == a }, nil); err != nil || !found {
				b.Fatalf("Sync: %v, found %v", err, found)
			}
			total += time.Since(t0)
			n++
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64(n), "sync-ns")
	})

	b.Run("path=wake", func(b *testing.B) {
		stamps := make(chan time.Time)
		lat := make(chan time.Duration)
		go func() {
			for t0 := range stamps {
				for {
					if err := m.Wait(time.Now().Add(5 * time.Second)); err != nil {
						close(lat)
						return
					}
					got := false
					m.Drain(func(Event) { got = true })
					if got {
						break
					}
				}
				lat <- time.Since(t0)
			}
		}()
		var lats []time.Duration
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		m.Drain(func(Event) {})
		for b.Loop() {
			a, _ := sys.MmapAnon(0, size, 0)
			sys.MunmapRange(a, size)
			stamps <- time.Now()
			d, ok := <-lat
			if !ok {
				b.Fatal("Wait failed")
			}
			lats = append(lats, d)
			// Let the waiter block again before the next munmap
			// (spinning: a timer sleep would take a millisecond).
			for t := time.Now(); time.Since(t) < 100*time.Microsecond; {
			}
		}
		close(stamps)
		slices.Sort(lats)
		b.ReportMetric(float64(lats[len(lats)/2].Nanoseconds())/1e3, "p50-µs")
		b.ReportMetric(float64(lats[len(lats)*99/100].Nanoseconds())/1e3, "p99-µs")
	})
}

// BenchmarkDrain measures the reader: ns/op per event drained from a full
// batch, with no allocation.
func BenchmarkDrain(b *testing.B) {
	m := benchMonitor(b, RawTracepoint, Config{RingSize: 1 << 20})
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a, _ := sys.MmapAnon(0, uintptr(os.Getpagesize()), 0)
	defer sys.MunmapRange(a, uintptr(os.Getpagesize()))
	m.Watch(a, 1)
	defer m.Unwatch(a, 1)
	const batch = 4096
	var sum uintptr
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for range batch {
			sys.Madvise(a, 1, sys.MadvDontneed)
		}
		b.StartTimer()
		n, err := m.Drain(func(e Event) { sum += e.Length })
		if err != nil || n < batch {
			b.Fatalf("drained %d of %d: %v", n, batch, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/event")
}

// BenchmarkEpoch is the cost a cache lookup pays to check the epoch.
func BenchmarkEpoch(b *testing.B) {
	m := benchMonitor(b, RawTracepoint, Config{})
	var x uint64
	for b.Loop() {
		x += m.Epoch()
	}
	_ = x
}

// BenchmarkProgram reads the kernel's run-time statistics of the attached
// programs (kernel.bpf_stats_enabled, through BPF_ENABLE_STATS) over 4 KiB
// mmap+munmap pairs: prog-ns/run is the mean time one program run takes,
// runs/op how many runs each pair caused (the one-program methods also run
// for every other system call of the machine). Noise of a shared machine
// barely touches it, unlike the munmap timings.
func BenchmarkProgram(b *testing.B) {
	for _, meth := range Methods() {
		for _, watched := range []bool{false, true} {
			name := "probes=" + string(meth) + "/watched=no"
			if watched {
				name = "probes=" + string(meth) + "/watched=yes"
			}
			b.Run(name, func(b *testing.B) {
				m := benchMonitor(b, meth, Config{})
				stats, err := ebpf.EnableStats(0) // BPF_STATS_RUN_TIME
				if err != nil {
					b.Skipf("skip: BPF_ENABLE_STATS: %v", err)
				}
				defer stats.Close()
				m.WatchAll(watched)
				defer m.WatchAll(false)
				read := func() (rt time.Duration, runs uint64) {
					for _, l := range m.links {
						info, err := l.Info()
						if err != nil {
							b.Fatal(err)
						}
						p, err := ebpf.NewProgramFromID(info.Program)
						if err != nil {
							b.Fatal(err)
						}
						s, err := p.Stats()
						p.Close()
						if err != nil {
							b.Fatal(err)
						}
						rt += s.Runtime
						runs += s.RunCount
					}
					return rt, runs
				}
				rt0, runs0 := read()
				n := 0
				for b.Loop() {
					a, _ := sys.MmapAnon(0, 4096, 0)
					sys.MunmapRange(a, 4096)
					if n++; n%1024 == 0 {
						m.Drain(func(Event) {})
					}
				}
				rt1, runs1 := read()
				if runs1 > runs0 {
					b.ReportMetric(float64((rt1-rt0).Nanoseconds())/float64(runs1-runs0), "prog-ns/run")
				}
				b.ReportMetric(float64(runs1-runs0)/float64(n), "runs/op")
			})
		}
	}
}
