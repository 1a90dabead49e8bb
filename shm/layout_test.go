package shm

import (
	"testing"
	"unsafe"
)

func TestLayoutChains(t *testing.T) {
	checks := []struct {
		name      string
		got, want int
	}{
		{"segment header fits its line", segHeaderEnd, 28},
		{"segment header size", SegmentHeaderSize, lineSize},
		{"ring control fits its line", ringControlEnd, 32},
		{"producer line", ringProducerLine, 1 * lineSize},
		{"consumer line", ringConsumerLine, 2 * lineSize},
		{"consumer doorbell", ringConsumerBell, 3 * lineSize},
		{"producer doorbell", ringProducerBell, 4 * lineSize},
		{"data area", RingHeaderSize, 5 * lineSize},
		{"record header", recHeaderSize, int(unsafe.Sizeof(uint64(0)))},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
	if segHeaderEnd > SegmentHeaderSize || ringControlEnd > lineSize {
		t.Errorf("a header overflows its line")
	}
	// Every shared word sits on its own line, apart from the control line's.
	offs := []int{ringTailOff, ringHeadOff, ringConsumerBell, ringProducerBell, RingHeaderSize}
	for i := 1; i < len(offs); i++ {
		if offs[i]-offs[i-1] < lineSize {
			t.Errorf("shared words at %d and %d share a line", offs[i-1], offs[i])
		}
	}
	if hdrReserved&(hdrCommitted|hdrPadding|hdrLenMask|uint64(0xffff)<<hdrTagShift) != 0 {
		t.Errorf("reserved header bits %#x overlap used bits", hdrReserved)
	}
}

func TestRecordSize(t *testing.T) {
	for _, c := range []struct{ n, want int }{{0, 8}, {1, 16}, {8, 16}, {9, 24}, {4096, 4104}} {
		if got := recordSize(c.n); got != c.want {
			t.Errorf("recordSize(%d) = %d, want %d", c.n, got, c.want)
		}
	}
	// The largest record, its worst padding and the gap fit an empty ring.
	for _, capacity := range []int{MinRingCapacity, 4096, 1 << 20} {
		r := recordSize(maxPayload(capacity))
		if worst := r + (r - recAlign) + recHeaderSize; worst > capacity {
			t.Errorf("capacity %d: worst case %d bytes does not fit", capacity, worst)
		}
	}
}
