// Package sockets is sandirect's switch: net.Listener and net.Conn over
// the emulated NIC (package nic) for peers on this host, and plain TCP for
// peers elsewhere, behind one API, so one program runs on one host or
// many. It is the switch of Windows Sockets Direct with its session
// protocol (docs/origins.md), which docs/protocol.md specifies;
// docs/locking.md gives the order of its locks among the nic's and pin's.
//
// # Networks
//
// Listen and Dial take "sandirect" with a Unix socket path or "@abstract"
// name (shared memory only), or "tcp", "tcp4", "tcp6" with host:port. A
// "tcp" listener listens on TCP and on the shared-memory name of its port;
// a "tcp" dial to an address of this host goes over shared memory when a
// listener of ours is there, and falls back to TCP otherwise; a dial to
// another host, or with Config.ForceTCP, is plain TCP. Accept returns
// *Conn and *net.TCPConn alike.
//
// # Session protocol
//
// Messages travel in the queue pair's rings, a window of them each way
// (the peer's credits). A write up to one message's payload (8 KiB) is
// one data message; up to Config.EagerThreshold (128 KiB), when the
// credits carry it, data messages of up to 16 KiB (two credits each,
// protocol version 6) that the reader copies out while the writer copies
// the next in. Larger ones send
// their first part inline in an rts stating the total, then the rest by
// rendezvous: the read rendezvous when the peer performs RDMA Reads (we
// expose the source, it reads, it says done), or the write rendezvous
// when it does not (it exposes a sink, we RDMA-Write, we say done). A
// large source is either registered in place (zero copy: the write waits
// until the peer took it) or copied into temporary device memory (the
// write returns at once); the switch picks by how the application
// behaves — and, for a large write the reader waits for (a request, an
// answer), by which way the connection measured faster for such writes,
// which depends on the host — and Counters show which path every byte
// took. A buffer from
// AllocBuffer is shared memory the peer maps: writes from it are read in
// place, one copy in all, at any size — where an ordinary buffer's large
// writes take two copies across the CPUs (AllocBuffer, FreeBuffer; for a
// connection that is not ours it is ordinary memory). An ordinary buffer
// that the application writes from again, and reads into again on the
// other side, goes as a split transfer from Config.SplitMin (2 MiB) up:
// both buffers are put into huge pages, and the reader copies the first
// half across the processes while the writer copies the second, one copy
// of every byte, both CPUs at once (protocol version 3). GlobalStats
// adds them up for the process, which publishes them for tools/sdstat as
// the group "sockets" while it has a connection or listener (publish.go);
// tools/sdtrace traces Reads and Writes with uprobes (trace.go).
//
// Conn is an io.WriterTo and an io.ReaderFrom, so that io.Copy between a
// Conn and a file, socket or buffer needs no bounce buffer: WriteTo hands
// received data to the destination's Write where it lies in the ring
// from the peer, ReadFrom reads the source into memory the peer maps.
//
// # Progress and waiting
//
// There is no background goroutine per connection: the goroutines that
// call Read, Write and Close drive the connection's completion queue
// themselves, one at a time, and wait as Config.Wait says (busy polling,
// parking, or spin while it pays then park): a waiting goroutine parks in
// the Go scheduler and holds no OS thread (shm's wake hubs), so thousands
// of idle connections with a Read waiting cost a few threads in all. The
// default, adaptive, spins (up to 60 µs) only while a connection's waits
// are shorter than two spins on average, and parks otherwise; a spin
// steps aside whenever another goroutine of the process is ready to run
// (the handler or writer its answer may need), so it takes only a CPU
// the process would leave idle. It suits programs that share their CPUs
// (gRPC, net/http). A Wait.Spin longer than the default's also spins,
// politely (yielding the thread's CPU to the kernel as it goes), through
// waits of up to a few hundred microseconds — a large gRPC call's — for
// lower latency at more CPU. Block mode never spins and costs
// no CPU while waiting, a wake-up per wait. Busy polling takes a CPU per
// waiting goroutine for the lowest latency, and the peer publishes to
// such a connection without a memory fence per message (it never sleeps,
// so no wake-up depends on the order; shm.Consumer.SetSpinning): for
// dedicated cores only, as on a machine without spare CPUs it starves the
// peer it waits for. In
// block mode a wait that follows a
// send of ours first looks for the answer for Config.ReplyWait (1 µs),
// about what a wake-up system call would cost: a quick answer then costs
// no sleep and no wake-up. A closed connection lingers in a goroutine of
// its own until the peer has taken what it wrote — unless all of it lies
// in the peer's ring already, which the peer reads after we hang up: then
// it hangs up at once.
//
// # Concurrency
//
// Conn and Listener are safe for concurrent use. Concurrent Reads are
// served one after the other, and so are concurrent Writes; one Write's
// bytes are never interleaved with another's. A Read and a Write in
// different goroutines do not wait for each other in the common case: a
// Read of data that has come, or that it waits for, and a Write whose
// data the credits it holds carry now, each run under a lock of their
// own direction. What is rarer — rendezvous, control messages, a wait for
// credit, errors — runs under both.
//
// # Errors
//
// Errors of Conn methods are *net.OpError values wrapping:
// os.ErrDeadlineExceeded after a deadline; net.ErrClosed after Close;
// io.EOF (unwrapped) after the peer's graceful close; an error matching
// syscall.ECONNRESET when the peer reset the connection or vanished;
// ErrProtocol when the peer broke the protocol and this side aborted the
// connection; syscall.EPIPE for a Write after CloseWrite; and
// syscall.EFAULT when the application's buffer faulted (below).
//
// # Locked memory
//
// Registration pins memory (mlock), within RLIMIT_MEMLOCK (8 MiB for an
// unprivileged user on Debian) or Config.MaxPinnedBytes. Short of it, or
// of registrations or temporary memory, neither side fails, and neither
// loses or repeats a byte: both take a path that needs less, slower but
// never stuck. A Write whose source cannot be pinned copies it; pieces of
// temporary memory that cannot be registered whole go shorter, down to a
// page; a Write that can register nothing at all goes as small messages,
// written into the ring to the peer, which needs no pinning. A Read whose
// buffer cannot be pinned receives through staging, and staging that
// cannot be registered whole goes in shorter pieces, down to a page.
// Counters.Fallbacks counts these. A connection pins nothing of its own
// (its messages are written and read in the rings): it needs the device's
// doorbell, a page, and one page to stage received data in — 8 KiB of
// RLIMIT_MEMLOCK is the least that carries data, and below it Dial and
// Accept fail with an error matching syscall.ENOBUFS. A Read fails with ENOBUFS only if, later, not one page
// of staging can be had (the process's other connections hold all of
// it); like the send side's ENOBUFS from AllocBuffer, it loses nothing,
// and the connection stays usable: the next Read tries again.
//
// # Application memory that faults
//
// A Read or Write whose buffer is unmapped (in part) under it fails with
// an error matching syscall.EFAULT that names the application's buffer;
// the process, and its other connections, carry on. It returns the bytes
// it accepted or delivered before the fault, exactly. What happens to the
// connection depends on who was copying:
//
//   - The switch itself — a small write's messages, the part of a large
//     write that travels inside its rts, pieces copied into temporary
//     memory, and every copy out to a Read's buffer (of small messages and
//     of the staging buffer): nothing of the faulting part was sent or
//     consumed, so the connection stays usable. The bytes not written can
//     be written again from good memory; the bytes not read are still
//     there for the next Read.
//   - The nic, by RDMA — a zero-copy source (which the peer RDMA-Reads, or
//     we RDMA-Write into the peer's sink), a large Read's own buffer (which
//     we RDMA-Read into, or the peer RDMA-Writes into), and both halves of
//     a split transfer: a failed work request puts the queue pair into the
//     error state, as verbs do, and part of the transfer may have landed.
//     The connection is aborted with the fault as its reason: the call and
//     every later one return it, and the peer sees a reset that names the
//     RDMA operation that failed.
//
// A buffer that is already unmapped when the call registers it cannot be
// pinned, so it is copied or staged instead: the first case. A buffer from
// AllocBuffer is the switch's own memory: the switch's copies of it are
// protected as any, but the nic copies device memory without protection
// (it cannot vanish while registered), so it must never be unmapped, only
// given back with FreeBuffer.
package sockets

// Where things live. conn.go: Conn and its API (Read, Write, Close,
// deadlines). session.go: the session state and the progress engine
// (polling, waiting). credits.go: the credit accounting. send.go: the send
// path, small messages and large writes' rendezvous from the sender's
// side. recv.go: the receive path, Reads, rendezvous from the receiver's
// side. dispatch.go: the handlers of the peer's messages and of
// completions. teardown.go: abort, reset, linger and teardown.
// rendezvous.go: huge pages for split transfers. policy.go: the pure
// choices of a large write's path. header.go: the wire format;
// handshake.go, dial.go, listener.go: setting a connection up; eager.go,
// copy.go, lowmem.go, fault.go: the eager threshold, io.Copy, short of
// locked memory, faulting application memory.
