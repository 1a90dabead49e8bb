// Package nic is sandirect's emulated SAN NIC: a verbs-like API over shared
// memory. A Device owns memory regions (registered buffers with local and
// remote keys), completion queues and queue pairs; a queue pair connects to
// a peer process through a connection manager on a Unix socket. It plays
// the SAN adapter and service provider of Windows Sockets Direct
// (docs/origins.md); docs/nic.md specifies its shared layouts and rules,
// docs/locking.md the order of its locks among the others'.
//
// # Data movement
//
// Sends travel as records in a shared ring from the sender's queue pair to
// the receiver's, where they land in posted receive buffers. RDMA Write and
// RDMA Read are one-sided: the initiator copies straight into or out of the
// target's registered memory, through its own mapping of the target's
// memory segment (memory from Device.Alloc: the fast path), or with
// process_vm_writev/readv for any other registered memory. Every one-sided
// operation is checked first against the target's registration table,
// which the target writes and the initiator maps read-only: rkey, bounds,
// access flags, and a sequence number that makes a revocation visible
// before any byte moves.
//
// # Progress
//
// Small sends and small RDMA operations run in the posting goroutine when
// nothing is queued ahead of them on the queue pair; everything else is
// queued to the device's engine goroutine, which moves large transfers in
// chunks, round-robin across queue pairs, so posting returns at once and
// one big transfer never starves small ones. A goroutine polling the send
// completion queue runs its queue pairs' queued work itself, and while it
// does the engine keeps off them (the data stays on one CPU's caches).
// Operations on one queue pair
// complete in the order they were posted. Incoming sends are matched with
// posted receives when the receive completion queue is polled or waited on,
// or when a receive is posted (manual progress, as libfabric calls it).
//
// # Receiver not ready
//
// A send that finds the peer's ring full (its receiver consumes nothing,
// for instance because it posts no receives) is retried by the engine for
// up to Config.RNRTimeout; then it completes with StatusRNRRetryExceeded
// and the queue pair moves to the error state, as an RC queue pair does in
// verbs when its RNR retry count runs out. Sends that fit wait in the ring
// until the receiver posts a receive.
//
// # Failure
//
// A dead peer (its connection-manager socket hangs up: the kernel closes a
// dead process's descriptors) moves the queue pair to the error state at
// once: every outstanding and later work request completes with
// StatusFlushed. A remote access violation completes with
// StatusRemoteAccess and moves the queue pair to the error state. Copies
// that touch application memory run with runtime/debug.SetPanicOnFault, so
// a buffer that vanished becomes an error completion, never a crash.
//
// # Concurrency
//
// Device, QueuePair and CompletionQueue are safe for concurrent use.
// MemoryRegion values are immutable after registration.
package nic
