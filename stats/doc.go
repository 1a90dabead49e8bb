// Package stats publishes a process's counters in shared memory, for tools
// (tools/sdstat) to read without stopping or slowing the process, and reads
// them back.
//
// # Publishing
//
// Layers register sources: Register(group, snapshot) for one group of
// counters, RegisterGroups for a source with several (a device and its
// queue pairs). While at least one source is registered the process owns
// one statistics table — a sealed memfd laid out as layout.go and
// docs/layout.md describe — and a background goroutine that, every
// Config.Interval (100 ms by default), calls every source's snapshot and
// rewrites the table under a seqlock. Hot paths pay nothing: counters are
// read only by that goroutine, only as often as the interval says.
//
// The process also listens on the abstract Unix socket
// "@sandirect-stats-PID". A reader connects, the process checks its
// credentials (SO_PEERCRED: the same effective uid, or root) and sends the
// table's fd (SCM_RIGHTS), which the reader maps read-only. Abstract names
// belong to no file system and vanish when the process dies, so the
// listening sockets in /proc/net/unix are the directory of live endpoints:
// nothing is left to clean up. When the last source unregisters, the
// goroutine, the socket and the segment go away. The environment variables
// SANDIRECT_STATS_OFF and SANDIRECT_STATS_INTERVAL, or Configure, change
// this.
//
// # Reading
//
// List finds the endpoints, Open(pid) maps one process's table, and
// Reader.Snapshot copies it. The table is written by another process: the
// reader checks the segment (seals, size, header), checks that the socket
// belongs to the pid it names, loads each word once, retries copies torn by
// a concurrent update, and validates every count, length and byte before
// using it. A bad table is an error matching ErrCorrupt, never a panic.
//
// # Concurrency
//
// Register, RegisterGroups, Configure, Err, List and Open are safe for
// concurrent use; so are a Reader's methods. A source's snapshot runs on
// the publisher's goroutine, never concurrently with itself, with the
// publisher's lock held: it must not register or unregister.
//
// # Errors
//
// Errors match the sentinels in errors.go (ErrNotFound, ErrGone,
// ErrCorrupt, ErrBusy, ErrClosed) or os.ErrPermission. Register never fails:
// what keeps a process from publishing is reported by Err.
package stats
