// Command bench is sandirect's benchmark harness, perftest-style: every
// measurement runs between two real processes, and the results are printed
// as a table, saved as JSON and plotted.
//
//	go run ./bench [-quick] [-out DIR] [-json FILE] [-pin=false] [SUITE...]
//
// With no SUITE every registered suite runs, in registration order (file
// name order; -h lists them): app (Go applications: gRPC-go unary calls
// and a bidirectional stream, net/http keep-alive GETs with 1 and 16
// clients, over sandirect with the default Config, a Unix socket and TCP
// loopback, interleaved; the server's OS threads with 10,000 idle
// connections each waiting in Read), conn (net.Conn ping-pong and streaming, 8 B
// to 16 MiB: sockets/busy, sockets/block, sockets/default and
// sockets/forcetcp against UCX, libfabric, unix, tcp, pipe and
// cloudwego/shmipc-go; memory per idle connection), floor
// (cache-line and futex round trips between two processes, single-core
// copy() bandwidth, the two-core pipeline that bounds any cross-core
// stream), pin (the registration cache), rdma (the emulated
// NIC's perftest cases, beside UCX's put and get) and ring (shm ring ping-pong in busy-poll and block
// mode, one-way streaming). When the two numbers of a target ratio were
// both measured, the ratio is printed with PASS or MISS; so are goals on
// single numbers.
//
// shmipc-go is measured by a module of its own, bench/shmipc, so that it
// stays out of sandirect's dependencies: the conn suite builds it with the
// go command and merges its records, or says why it could not
// (SANDIRECT_BENCH_SHMIPC=0 leaves it out). So are the app suite's
// measurements, bench/app (gRPC-go; SANDIRECT_BENCH_APP), and the
// report's figures, bench/plot (gonum/plot; SANDIRECT_BENCH_PLOT): where
// bench/plot cannot be built, the report is bench.json alone and the run
// says why (appmod.go).
//
// UCX and libfabric are measured by their own benchmarks over shared
// memory, ucx_perftest and fi_pingpong (Debian's ucx-utils and
// libfabric-bin), a server pinned to the peer's CPU and a client to this
// process's, as ours are; where a tool is not installed the suite says so
// and goes on without it (SANDIRECT_BENCH_UCX, SANDIRECT_BENCH_OFI: the
// tool's path, or 0 to leave it out). docs/peers.md says what each tool
// reports and how it becomes our records.
//
// # Output
//
// Latency is half a round trip in nanoseconds (min, median, p99, p99.9),
// timed per round trip with one monotonic clock read each (the header line
// says what one read costs, tens of ns on a KVM guest with the tsc clock
// source; the floors pay it too). Bandwidth is payload GB/s (1e9 bytes/s),
// rate million messages/s. The preempt column counts involuntary context
// switches of the two measuring threads during the row's measurement,
// warm-up included: busy-polling needs its CPUs, and a row with thousands
// was disturbed by other work (the targets section then warns).
// Bandwidth is measured in chunks (copy(): timed batches): the GB/s column
// is the median chunk, the range column the slowest and the fastest.
// Sleeping transports of the conn suite run unpinned, as a Go program runs
// (their preempt column is "-"); busy-polling ones pinned. The handoff
// column (conn suite, and the rdma suite's write_lat and UCX rows) is the
// cache-line hand-off between the two CPUs
// measured just before the row (the median half round trip of a shared
// word, 10 ms): the host moves the two vCPUs near and far apart from one
// minute to the next, every row moves with it, and a target against a
// peer says so when its two rows' hand-offs differ by more than half.
//
// # Report
//
// -out DIR (default sandirect-report, in the current directory; created,
// files overwritten; empty: none) receives bench.json, the records below,
// and for each suite a figure, SUITE.svg and SUITE.png: latency (median,
// bars from min to p99) and bandwidth (bars over the chunks) against
// message size, log-log, one line per transport, the floors as dashed
// references, the hardware in the title. The paths are printed at the end,
// after a side-by-side table of the conn suite's headline numbers (one row
// per transport, the floors under it) and the targets.
// On a terminal, a progress bar on stderr shows the rows done and to come.
//
// Every number becomes one record (also written with -json FILE):
//
//	{"suite":"ring","case":"pingpong","transport":"ring/busy","size":8,"metric":"lat_p50_ns","value":61.2}
//
// Metrics: lat_min_ns, lat_p50_ns, lat_p99_ns, lat_p999_ns, bw_gbps (the
// median chunk), bw_min_gbps, bw_max_gbps, rate_mps, mem_bytes; the app
// suite's idle rows: conns, threads, gomaxprocs, wake_all_ns. In the app
// suite latency is per call (a whole round trip) and rate_mps counts calls,
// echoes or requests (millions per second).
// Transports: cacheline, futex, futex/unpinned, futexcond/unpinned, memcpy,
// pipeline/cached, pipeline/nt, pipeline/best, ring/busy,
// ring/block, nic/shm, nic/cma, cma/raw, pin/…, unix, tcp, pipe,
// sockets/busy, sockets/block, sockets/busy+shared, sockets/default,
// sockets/forcetcp (until 2026-11 this row was sockets/tcp, a tcp address
// that the dialer routed over shared memory), shmipc, ucx/tag, ucx/stream,
// ofi/shm (conn), ucx/put, ucx/get (rdma), grpc/sandirect, grpc/unix,
// grpc/tcp, http/sandirect, http/unix, http/tcp, sockets/default (app:
// idle); the interleaved copy() references memcpy
// (rdma suite, beside nic/shm's bandwidth) and memcpy@TRANSPORT (conn
// suite, beside that transport's 1, 4 and 16 MiB streams). Other tools read these
// names: keep them stable.
//
// # Adding a suite
//
// A suite is one file: an init that calls register with a Suite (name, one
// line of doc, Run, and Rows for the progress bar) and registerPeer for the
// role its peer process plays.
// Run creates its shared segments, starts the peer with startPeer (the
// segments become the peer's fds 4, 5, …), and for each measurement calls
// peer.run with a command, a function that aborts the parent's side, and
// the parent's side itself, usually wrapped in pinned. The peer role serves
// commands with peerConn.serve: attach, ready, take part, return. newSampler,
// summarize, throughput and Env.Report do the rest; a ratio between two
// records of one run goes into targets. Another byte-stream transport for
// the conn suite is one entry in connTransports: how the parent listens and
// how the peer dials.
//
// # Processes
//
// The peer is this same binary re-executed with SANDIRECT_BENCH_PEER set to
// its role (under go test, the test binary: its TestMain hands over to
// peerMain). It gets a control socket as fd 3, exits when that closes, is
// killed with SIGKILL when the parent dies (PR_SET_PDEATHSIG), when the
// parent's side fails, or when the run is interrupted; its output is kept
// and reported with any error. Segments are memfds: nothing is left behind.
//
// # Errors
//
// run returns the first error; main prints it on one line to stderr and
// exits with status 1. The records measured before a failure are still
// written (-json, -out). In the conn suite a failing transport does not stop
// the others: its error is printed in the table and returned at the end.
package main
