//go:build linux

package sys

import "testing"

// TestMainStackAuxv: the stack's top from the auxiliary vector is the
// [stack] mapping's end in /proc/self/maps, and MainStack's range holds
// the whole mapping.
func TestMainStackAuxv(t *testing.T) {
	top := stackTopAuxv()
	if top == 0 {
		t.Fatal("no stack top from the auxiliary vector (AT_EXECFN)")
	}
	lo, hi, err := mainStackMaps()
	if err != nil {
		t.Fatal(err)
	}
	if top != hi {
		t.Fatalf("top from AT_EXECFN %#x, [stack]'s end in /proc/self/maps %#x", top, hi)
	}
	glo, ghi, err := MainStack()
	if err != nil {
		t.Fatal(err)
	}
	if ghi != hi || glo > lo {
		t.Fatalf("MainStack = [%#x, %#x), want the top %#x and at least down to %#x", glo, ghi, hi, lo)
	}
}
