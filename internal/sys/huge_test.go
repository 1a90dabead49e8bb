package sys

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCollapseHuge: the aligned blocks inside a slice become huge pages,
// and not a byte of it changes.
func TestCollapseHuge(t *testing.T) {
	const length = 12 << 20
	addr, err := MmapAnon(0, length, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer MunmapRange(addr, length)
	all := Bytes(addr, length)
	for i := range all {
		all[i] = byte(i*7 + 1)
	}
	before, err := AnonHugeBytes(addr)
	if err != nil {
		t.Fatal(err)
	}
	b := all[3<<20+123 : 11<<20]
	lo, n := HugeRange(b)
	if n == 0 || lo < Addr(b) || lo+n > Addr(b)+uintptr(len(b)) || lo%HugePage != 0 {
		t.Fatalf("HugeRange of [%#x, +%d) = [%#x, +%d)", Addr(b), len(b), lo, n)
	}
	got, err := CollapseHuge(b)
	if errors.Is(err, unix.EINVAL) {
		t.Skip("this kernel cannot collapse huge pages (MADV_COLLAPSE):", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got != int(n) {
		t.Fatalf("CollapseHuge reported %d bytes, the aligned part is %d", got, n)
	}
	after, err := AnonHugeBytes(addr)
	if err != nil {
		t.Fatal(err)
	}
	if after-before < int64(n) {
		t.Fatalf("huge pages in the mapping: %d before, %d after collapsing %d bytes", before, after, n)
	}
	for i := range all {
		if all[i] != byte(i*7+1) {
			t.Fatalf("byte %d changed", i)
		}
	}
	if got, err := CollapseHuge(all[:HugePage-1]); got != 0 || err != nil {
		t.Fatalf("a slice with no aligned block: %d, %v", got, err)
	}
}
