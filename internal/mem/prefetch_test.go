package mem

import "testing"

// TestPrefetch: a prefetch of any part of a slice, of its last byte, of a
// span of many lines or of an empty slice neither faults nor changes what
// it asks for.
func TestPrefetch(t *testing.T) {
	b := make([]byte, 4096+3)
	for i := range b {
		b[i] = byte(i)
	}
	Prefetch(b)
	Prefetch(b[1:70])
	Prefetch(b[len(b)-1:])
	Prefetch(b[len(b):])
	Prefetch(nil)
	for i, v := range b {
		if v != byte(i) {
			t.Fatalf("byte %d changed: %d", i, v)
		}
	}
}
