// Package sockets is sandirect's switch: net.Listener and net.Conn over
// the emulated NIC (package nic) for peers on this host, and plain TCP for
// peers elsewhere, behind one API, so one program runs on one host or
// many. It is the switch of Windows Sockets Direct with its session
// protocol (docs/origins.md), which docs/protocol.md specifies.
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
// Each connection owns a registered pool of control-message buffers: some
// posted for receive (the peer's credits), some for sends. Writes up to
// Config.EagerThreshold travel inside control messages. Larger ones send
// their first part inline in an rts stating the total, then the rest by
// rendezvous: the read rendezvous when the peer performs RDMA Reads (we
// expose the source, it reads, it says done), or the write rendezvous
// when it does not (it exposes a sink, we RDMA-Write, we say done). A
// large source is either registered in place (zero copy: the write waits
// until the peer took it) or copied into temporary device memory (the
// write returns at once); the switch picks by how the application
// behaves, and Counters show which path every byte took. A buffer from
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
// # Progress and waiting
//
// There is no background goroutine per connection: the goroutines that
// call Read, Write and Close drive the connection's completion queue
// themselves, one at a time, and wait as Config.Wait says (busy polling,
// futex sleep, or spin then sleep). In block mode a wait that follows a
// send of ours first looks for the answer for Config.ReplyWait (1 µs),
// about what a wake-up system call would cost: a quick answer then costs
// no sleep and no wake-up. A closed connection lingers in a goroutine of
// its own until the peer has taken what it wrote.
//
// # Concurrency
//
// Conn and Listener are safe for concurrent use. Concurrent Reads are
// served one after the other, and so are concurrent Writes; one Write's
// bytes are never interleaved with another's.
//
// # Errors
//
// Errors of Conn methods are *net.OpError values wrapping:
// os.ErrDeadlineExceeded after a deadline; net.ErrClosed after Close;
// io.EOF (unwrapped) after the peer's graceful close; an error matching
// syscall.ECONNRESET when the peer reset the connection or vanished;
// ErrProtocol when the peer broke the protocol and this side aborted the
// connection; syscall.EPIPE for a Write after CloseWrite; and, from Write,
// an error matching syscall.ENOBUFS when registration or temporary memory
// failed: the bytes accepted so far are counted, nothing is lost, and the
// connection stays usable.
package sockets
