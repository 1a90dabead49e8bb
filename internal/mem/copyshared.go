package mem

// repMin is the size from which CopyShared copies with a string move:
// below it the string move's start-up costs more than the line transfers
// it saves (docs/performance.md, "Copies into shared memory").
const repMin = 2048

// CopyShared is copy for a destination that another CPU reads, and has
// read before: a ring to a peer process. Go's copy() stores through the
// caches with vector moves, and each store first reads its line back from
// the reader's cache (a request for ownership across the cores); a string
// move (REP MOVSB, on CPUs that make it fast) writes whole lines without
// reading them. Where the lines are this core's already, it costs about
// what copy() does. Short copies, overlapping slices and other
// architectures use copy. It returns min(len(dst), len(src)).
func CopyShared(dst, src []byte) int {
	n := min(len(dst), len(src))
	if !repSupported || n < repMin || overlap(dst[:n], src[:n]) {
		return copy(dst, src)
	}
	// Bounded like CopyNT's steps: the string move cannot be preempted.
	for off := 0; off < n; off += ntStep {
		k := min(n-off, ntStep)
		copyRepBody(dst[off:off+k], src[off:off+k])
	}
	return n
}
