package nic

// Trace points for tools/sdtrace, which puts uprobes on the entry of
// functions of a running program and reads their arguments from the
// registers (Go's register ABI on amd64: integer arguments in RAX, RBX,
// RCX, RDI, RSI, in order; a pointer is one word). Each is an empty
// function with plain integer arguments, called where the event happens:
// the device's and queue pairs' internals can change shape without the
// tracer noticing, these must not. Keep their names and signatures in
// step with tools/sdtrace/probes.go, and keep them real calls (they are
// marked noinline). Untraced, each costs one call.
// sdtrace also probes the entries of QueuePair.PostSend and PostRecv,
// whose signatures and work request types are API.

// traceRegister marks the start of a registration of [addr, addr+n)
// (Register, RegisterRemote, RegisterFor). RAX addr, RBX n.
//
//go:noinline
func traceRegister(addr uintptr, n int) {}

// traceRegistered marks its success: the region [addr, addr+n) is in the
// registration table with lkey and rkey (0 without remote access). RAX
// addr, RBX n, RCX lkey, RDI rkey.
//
//go:noinline
func traceRegistered(addr uintptr, n int, lkey uint32, rkey uint64) {}

// traceSendDone marks the end of send work request id of qp, a send, an
// RDMA Write or an RDMA Read (op), signaled or not, that moved bytes and
// ended with st. qp names the queue pair, as the receiver of PostSend
// does. RAX qp, RBX id, RCX op, RDI bytes, RSI st (low bytes for op, st).
//
//go:noinline
func traceSendDone(qp *QueuePair, id uint64, op Opcode, bytes int, st Status) {}

// traceRecvDone marks the end of receive work request id of qp: a message
// of bytes landed in its buffer (st StatusSuccess) or could not. RAX qp,
// RBX id, RCX bytes, RDI st (its low byte).
//
//go:noinline
func traceRecvDone(qp *QueuePair, id uint64, bytes int, st Status) {}
