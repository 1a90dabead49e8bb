package mem

import (
	"fmt"
	"runtime/debug"
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
)

// TestCopyFaultRecovers: a copy whose source faults (a page made
// inaccessible) panics with the fault's address under
// debug.SetPanicOnFault, as copy() does, for the callers that recover from
// it (sockets' and nic's guarded copies), instead of killing the process.
func TestCopyFaultRecovers(t *testing.T) {
	for _, c := range copies {
		t.Run(c.name, func(t *testing.T) {
			m, err := sys.MapAnon(3 * 4096)
			if err != nil {
				t.Skip(err)
			}
			defer sys.Munmap(m)
			bad := m[4096 : 2*4096]
			if err := sys.ProtectNone(bad); err != nil {
				t.Fatal(err)
			}
			dst := make([]byte, 2*4096)
			addr, err := faultAddr(func() { c.copy(dst, m[2048:2048+len(dst)]) })
			if err == nil {
				t.Fatal("copy from an inaccessible page did not fault")
			}
			if addr < Addr(bad) || addr >= Addr(bad)+uintptr(len(bad)) {
				t.Fatalf("fault at %#x, outside the inaccessible page [%#x, +%#x)", addr, Addr(bad), len(bad))
			}
		})
	}
}

// faultAddr runs f with faults turned into panics and returns the
// address of the fault it recovered, or a nil error if f did not fault.
func faultAddr(f func()) (addr uintptr, err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		r := recover()
		if r == nil {
			return
		}
		e, ok := r.(interface{ Addr() uintptr })
		if !ok {
			panic(r)
		}
		addr, err = e.Addr(), fmt.Errorf("fault: %v", r)
	}()
	f()
	return 0, nil
}

// BenchmarkCopyLocal copies within this core's caches: what CopyShared
// costs where no other core holds the destination's lines (within a few
// percent of copy() from 2 KiB). The case it is for, a destination
// another process reads, is the conn suite's (docs/performance.md).
func BenchmarkCopyLocal(b *testing.B) {
	fns := append([]struct {
		name string
		copy func(dst, src []byte) int
	}{{"copy", func(d, s []byte) int { return copy(d, s) }}}, copies...)
	for _, n := range []int{1024, 2048, 8192, 65536} {
		for _, c := range fns {
			b.Run(fmt.Sprintf("%s/size=%d", c.name, n), func(b *testing.B) {
				src, dst := make([]byte, 256<<10), make([]byte, 256<<10)
				b.SetBytes(int64(n))
				off := 0
				for b.Loop() {
					c.copy(dst[off:off+n], src[off:off+n])
					if off += n; off+n > len(dst) {
						off = 0
					}
				}
			})
		}
	}
}
