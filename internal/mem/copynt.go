package mem

// ntStep bounds one call into the assembly loop, which the scheduler
// cannot preempt: 64 KiB is a few microseconds.
const ntStep = 64 << 10

// CopyNT is copy with non-temporal stores: the destination goes to memory
// without being read into this core's caches first, and does not evict
// them. It is for large copies whose destination another core reads next
// when the line transfer between the two cores is slow (see sockets'
// pieceCopier); elsewhere copy is faster. Short copies, unaligned heads and
// tails, overlapping slices and other architectures use copy. It returns
// the number of bytes copied, min(len(dst), len(src)).
func CopyNT(dst, src []byte) int {
	n := min(len(dst), len(src))
	if !ntSupported || n < 4096 || overlap(dst[:n], src[:n]) {
		return copy(dst, src)
	}
	dst, src = dst[:n], src[:n]
	// Align the destination to a cache line.
	head := int((64 - Addr(dst)%64) % 64)
	copy(dst[:head], src[:head])
	dst, src = dst[head:], src[head:]
	for len(dst) >= 64 {
		k := min(len(dst), ntStep) &^ 63
		copyNTBody(dst[:k], src[:k])
		dst, src = dst[k:], src[k:]
	}
	copy(dst, src)
	return n
}

// overlap tells whether a and b share any byte.
func overlap(a, b []byte) bool {
	pa, pb := Addr(a), Addr(b)
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
