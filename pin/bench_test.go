package pin

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	default:
		return fmt.Sprintf("%dKiB", n>>10)
	}
}

// BenchmarkRegister: Register+Deregister of a reused buffer, cached (a hit)
// and uncached (pin and unpin each time), against raw mlock+munlock.
func BenchmarkRegister(b *testing.B) {
	for _, size := range benchSizes {
		buf, err := Alloc(size)
		if err != nil {
			b.Fatal(err)
		}
		for i := range buf {
			buf[i] = 1 // touched, as a reused buffer is
		}
		b.Run("cache=on/size="+sizeName(size), func(b *testing.B) {
			c := newCache(b, &Config{Monitor: MonitorOwned})
			deregister(b, c, register(b, c, buf, 0))
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				h, err := c.Register(buf, 0)
				if err != nil {
					b.Fatal(err)
				}
				c.Deregister(h)
			}
			if st := c.Stats(); st.Misses != 1 {
				b.Fatalf("misses %d, want 1", st.Misses)
			}
		})
		b.Run("cache=off/size="+sizeName(size), func(b *testing.B) {
			c := newCache(b, &Config{Monitor: MonitorNone})
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				h, err := c.Register(buf, 0)
				if err != nil {
					b.Fatal(err)
				}
				c.Deregister(h)
			}
		})
		b.Run("cache=raw-mlock/size="+sizeName(size), func(b *testing.B) {
			addr := sys.Addr(buf)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if err := sys.Mlock(addr, uintptr(size)); err != nil {
					b.Fatal(err)
				}
				sys.Munlock(addr, uintptr(size))
			}
		})
		Free(buf)
	}
}

// BenchmarkHit is Register alone on a cached buffer (the handles are given
// back after the timed loop), foreign memory under userfaultfd: the epoch
// check, the lookup and the hold.
func BenchmarkHit(b *testing.B) {
	c := newCache(b, foreignMonitor(b))
	addr, buf := mapAnon(b, 1)
	defer munmap(b, addr, 1)
	deregister(b, c, register(b, c, buf, 0))
	b.ReportAllocs()
	n := 0
	var h Handle
	for b.Loop() {
		h, _ = c.Register(buf, 0)
		n++
	}
	b.StopTimer()
	for range n {
		c.Deregister(h)
	}
	if st := c.Stats(); st.Misses != 1 {
		b.Fatalf("misses %d, want 1", st.Misses)
	}
}

// BenchmarkReopen: a cache created, its monitor ready, and closed, as a
// program whose device closes between bursts of connections has it. With
// the idle monitor kept (the default) the next cache adopts it; with none,
// each cache loads its own eBPF programs and detaches them at Close.
// Reports the CPU time the process spent per cycle.
func BenchmarkReopen(b *testing.B) {
	for _, bc := range []struct {
		name   string
		linger time.Duration
	}{{"idle", DefaultIdleMonitorLinger}, {"none", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			defer SetIdleMonitorLinger(SetIdleMonitorLinger(bc.linger))
			defer CloseIdleMonitors()
			var kind MonitorKind
			cpu0 := cpuTime(b)
			for b.Loop() {
				c, err := New(nil)
				if err != nil {
					b.Fatal(err)
				}
				kind = c.Monitor().Kind
				if err := c.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			b.Logf("monitor %v", kind)
		})
	}
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
