package mem

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The copies other than copy(), each tested against copy's semantics.
var copies = []struct {
	name string
	copy func(dst, src []byte) int
}{
	{"CopyNT", CopyNT},
	{"CopyShared", CopyShared},
}

// TestCopy copies every combination of misaligned source and destination
// and lengths around the thresholds, and checks the bytes around the
// destination are untouched.
func TestCopy(t *testing.T) {
	for _, c := range copies {
		t.Run(c.name, func(t *testing.T) { testCopy(t, c.copy) })
	}
}

func testCopy(t *testing.T, copyFn func(dst, src []byte) int) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 300<<10)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	dstBuf := make([]byte, len(src)+256)
	for _, n := range []int{0, 1, 63, 2047, 2048, 2049, 4095, 4096, 4097, 64 << 10, 64<<10 + 1, 200<<10 + 37, 300<<10 - 64} {
		for _, so := range []int{0, 1, 15, 16, 63} {
			for _, do := range []int{0, 3, 16, 48, 64} {
				if so+n > len(src) {
					continue
				}
				for i := range dstBuf {
					dstBuf[i] = 0xA5
				}
				dst := dstBuf[do : do+n]
				if got := copyFn(dst, src[so:so+n]); got != n {
					t.Fatalf("n=%d so=%d do=%d: copied %d", n, so, do, got)
				}
				if !bytes.Equal(dst, src[so:so+n]) {
					t.Fatalf("n=%d so=%d do=%d: bytes differ", n, so, do)
				}
				for i, b := range dstBuf {
					if (i < do || i >= do+n) && b != 0xA5 {
						t.Fatalf("n=%d so=%d do=%d: byte %d outside the destination changed", n, so, do, i)
					}
				}
			}
		}
	}
	// Shorter source, and overlapping slices (copy's semantics).
	if got := copyFn(make([]byte, 10<<10), src[:5<<10]); got != 5<<10 {
		t.Fatalf("short source: copied %d", got)
	}
	buf := append([]byte(nil), src[:100<<10]...)
	want := append([]byte(nil), buf[:90<<10]...)
	copyFn(buf[10<<10:], buf[:90<<10])
	if !bytes.Equal(buf[10<<10:], want) {
		t.Fatal("overlapping copy differs from copy's")
	}
}

func BenchmarkCopyNT(b *testing.B) {
	src, dst := make([]byte, 960<<10), make([]byte, 960<<10)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		CopyNT(dst, src)
	}
}
