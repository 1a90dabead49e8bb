package pin

// Trace points for tools/sdtrace, which puts uprobes on the entry of
// functions of a running program and reads their arguments from the
// registers (Go's register ABI on amd64: integer arguments in RAX, RBX,
// RCX, RDI, RSI, in order). Each is an empty function with plain integer
// arguments, called where the event happens: the cache's internals can
// change shape without the tracer noticing, these must not. Keep their
// names and signatures in step with tools/sdtrace/probes.go, and keep them
// real calls (they are marked noinline). Untraced, each costs one call.
// sdtrace also probes the entry of Cache.RegisterFor, whose signature is
// API.

// traceHit marks a RegisterFor of [addr, addr+n) that a cached entry,
// covering [lo, hi), serves. RAX addr, RBX n, RCX lo, RDI hi.
//
//go:noinline
func traceHit(addr uintptr, n int, lo, hi uintptr) {}

// traceMiss marks a RegisterFor of [addr, addr+n) that no cached entry
// serves: it is about to pin and register. RAX addr, RBX n.
//
//go:noinline
func traceMiss(addr uintptr, n int) {}

// traceDeregister marks a Deregister of the Handle for [addr, addr+n),
// whose entry covers [lo, hi). RAX addr, RBX n, RCX lo, RDI hi.
//
//go:noinline
func traceDeregister(addr uintptr, n int, lo, hi uintptr) {}

// traceInvalidate marks the invalidation of the entry covering [lo, hi)
// because the mapping of [slo, shi) changes; unmapped tells that those
// pages are gone already (InvalidateUnmapped, a monitor's event). RAX lo,
// RBX hi, RCX slo, RDI shi, RSI unmapped (its low byte).
//
//go:noinline
func traceInvalidate(lo, hi, slo, shi uintptr, unmapped bool) {}
