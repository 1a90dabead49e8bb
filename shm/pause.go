package shm

// Pause tells the CPU that the caller is in a spin-wait loop, as x86's
// PAUSE and arm64's YIELD instructions do: call it after each look that
// found nothing. A loop of bare loads keeps many loads of the watched
// line in flight, and when the peer's store takes the line, the CPU
// throws all of them away before the loop can exit (a memory-order
// machine clear). With a Pause between looks, a spinning reader leaves
// its loop sooner after a cross-process store (docs/performance.md, "The
// measuring loop's spin").
func Pause() { pause() }
