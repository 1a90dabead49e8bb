// Package shm is sandirect's fabric: shared-memory segments passed between
// processes as sealed memfds, single-producer single-consumer rings of
// variable-length records inside them, doorbell words through which a
// waiting side announces that it sleeps, and wake hubs that let it sleep
// in the Go scheduler until a peer wakes it. It plays the SAN of Windows
// Sockets Direct (docs/origins.md); docs/layout.md specifies its layouts,
// and docs/locking.md the one lock it has (a hub's), a leaf of the order.
//
// # Segments
//
// A Segment is a memfd sealed against shrinking and growing before any peer
// sees it, mapped MAP_SHARED and pre-faulted (or not: CreateSegmentLazy,
// OpenSegmentLazy, for memory that stays mostly untouched). It travels to a peer as an fd
// over a Unix socket (SCM_RIGHTS). The receiver checks the seals, the size
// and the header before it trusts the mapping: an unsealed fd could be
// truncated under us and kill the process with SIGBUS.
//
// # Rings
//
// A ring is laid out as docs/layout.md and layout.go describe. One process
// owns the Producer side and one the Consumer side; each side is used by one
// goroutine at a time (neither is safe for concurrent use by several
// goroutines; Close and Fail are the exceptions and may be called from any
// goroutine). The record header word is the commit: the producer writes the
// payload, zeroes the header of the slot after the record, then stores the
// header with one atomic store. The consumer needs no other signal.
//
// # Trust
//
// Everything in a segment may be written by another process at any time.
// Both sides keep private copies of geometry and positions, load each shared
// word once, validate it, and only then use it. A bad value fails the side
// with an error matching ErrCorrupt, permanently; it never panics and never
// reads or writes outside the mapping.
//
// # Waiting
//
// Everything waits one way, WaitStrategy (wait.go): look, spin while
// spinning pays (with a Pause between looks, which leaves the loop
// sooner once the peer's store lands), then announce in a doorbell word
// of the segment that it sleeps — the slot of its Waiter in its
// process's Hub — re-check, and park the goroutine (hub.go). The other
// side wakes it only when it sees the announcement: it marks the slot in
// the sleeper's hub and writes to the hub's pipe, which one goroutine of
// the sleeper's process waits on in the runtime's netpoller. So a waiting goroutine holds no OS thread,
// and a busy connection makes no system call. Both the announcement and
// the check are sequentially consistent atomics, so no wake-up is lost.
// Busy-poll and block-only are modes of the same mechanism.
package shm
