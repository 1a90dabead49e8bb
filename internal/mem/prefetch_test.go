package mem

import "testing"

// TestPrefetch: a prefetch of any byte of a slice, or of an empty one,
// neither faults nor changes what it asks for.
func TestPrefetch(t *testing.T) {
	b := []byte{1, 2, 3}
	Prefetch(b)
	Prefetch(b[3:])
	Prefetch(nil)
	if b[0] != 1 || b[1] != 2 || b[2] != 3 {
		t.Fatalf("prefetched bytes changed: %v", b)
	}
}
