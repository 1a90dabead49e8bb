package sockets

// A trace point for tools/sdtrace, which puts uprobes on the entry of
// functions of a running program and reads their arguments from the
// registers. Go functions must not get return probes (a uretprobe rewrites
// the return address on the goroutine's stack, which the runtime moves and
// unwinds: the target dies), so the end of a Read or Write is marked by a
// call to traceIO, which does nothing and costs one call.

// ioOp tells traceIO which call ended.
type ioOp uint8

const (
	ioRead  ioOp = 1
	ioWrite ioOp = 2
)

// traceIO marks the end of c's Read or Write (op) that returned n and err.
// tools/sdtrace reads its arguments by Go's register ABI on amd64: c in
// RAX, op in RBX, n in RCX, err in RDI and RSI (type word, data word).
// Keep the signature in step with tools/sdtrace/probes.go. It must stay a
// real call: go:noinline.
//
//go:noinline
func traceIO(c *Conn, op ioOp, n int, err error) {}
