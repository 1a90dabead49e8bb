package pin

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
)

var page = uintptr(sys.PageSize)

func newCache(tb testing.TB, cfg *Config) *Cache {
	tb.Helper()
	c, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// closeIdle closes the idle monitor (idle.go), so that the next cache
// loads its own.
func closeIdle(tb testing.TB) {
	tb.Helper()
	if err := CloseIdleMonitors(); err != nil {
		tb.Fatalf("CloseIdleMonitors: %v", err)
	}
}

// mapAnon maps pages of anonymous memory; the test unmaps it.
func mapAnon(tb testing.TB, pages int) (uintptr, []byte) {
	tb.Helper()
	p, err := sys.MmapAnon(0, uintptr(pages)*page, 0)
	if err != nil {
		tb.Fatalf("mmap: %v", err)
	}
	return p, sys.Bytes(p, uintptr(pages)*page)
}

func munmap(tb testing.TB, addr uintptr, pages int) {
	tb.Helper()
	if err := sys.MunmapRange(addr, uintptr(pages)*page); err != nil {
		tb.Fatalf("munmap: %v", err)
	}
}

func register(tb testing.TB, c *Cache, b []byte, a Access) Handle {
	tb.Helper()
	h, err := c.Register(b, a)
	if err != nil {
		tb.Fatalf("Register(%#x, %d): %v", sys.Addr(b), len(b), err)
	}
	return h
}

func deregister(tb testing.TB, c *Cache, h Handle) {
	tb.Helper()
	if err := c.Deregister(h); err != nil {
		tb.Fatalf("Deregister: %v", err)
	}
}

// kernelLocked tells whether the kernel has the page at addr locked
// (VM_LOCKED, "lo" in the VmFlags of /proc/self/smaps).
func kernelLocked(tb testing.TB, addr uintptr) bool {
	tb.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if rng, _, ok := strings.Cut(line, " "); ok && strings.Contains(rng, "-") && !strings.HasSuffix(rng, ":") {
			a, b, _ := strings.Cut(rng, "-")
			lo, err1 := strconv.ParseUint(a, 16, 64)
			hi, err2 := strconv.ParseUint(b, 16, 64)
			in = err1 == nil && err2 == nil && uint64(addr) >= lo && uint64(addr) < hi
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			for _, f := range strings.Fields(line)[1:] {
				if f == "lo" {
					return true
				}
			}
			return false
		}
	}
	return false
}

// wantLocked checks the cache's pin count and the kernel's lock of each page.
func wantLocked(tb testing.TB, c *Cache, addr uintptr, pages int, count int32) {
	tb.Helper()
	for i := 0; i < pages; i++ {
		a := addr + uintptr(i)*page
		if got := c.pinCount(a); got != count {
			tb.Errorf("page %d (%#x): pin count %d, want %d", i, a, got, count)
		}
		if got := kernelLocked(tb, a); got != (count > 0) {
			tb.Errorf("page %d (%#x): kernel locked %v, want %v", i, a, got, count > 0)
		}
	}
}

// monitors is the monitors under which behaviour that concerns foreign
// memory is tested: those that can run here.
// ebpfMonitor returns a config for the eBPF monitor, or skips where it
// cannot run; with SANDIRECT_REQUIRE_EBPF set it fails instead.
func ebpfMonitor(tb testing.TB) *Config {
	tb.Helper()
	c, err := New(&Config{Monitor: MonitorEBPF})
	if err != nil {
		if os.Getenv("SANDIRECT_REQUIRE_EBPF") != "" {
			tb.Fatalf("eBPF monitor required: %v", err)
		}
		tb.Skipf("eBPF monitor: %v", err)
	}
	c.Close()
	return &Config{Monitor: MonitorEBPF}
}

func foreignMonitor(tb testing.TB) *Config {
	tb.Helper()
	c, err := New(&Config{Monitor: MonitorUserfaultfd})
	if err != nil {
		tb.Skipf("userfaultfd monitor: %v", err)
	}
	c.Close()
	return &Config{Monitor: MonitorUserfaultfd}
}
