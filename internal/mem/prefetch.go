package mem

// Prefetch asks the CPU to bring the cache lines b spans into this core's
// caches now, without waiting for them: a hint, which fences and locked
// instructions do not wait for as they wait for a load. Empty b asks
// nothing. On other architectures it does nothing.
func Prefetch(b []byte) {
	if len(b) > 0 {
		prefetch(&b[0], (len(b)+63)/64)
	}
}
