// Command bench is sandirect's benchmark harness, perftest-style: every
// measurement runs between two real processes, and the results are printed
// as a table and optionally saved as JSON.
//
//	go run ./bench [-quick] [-json FILE] [-pin=false] [SUITE...]
//
// With no SUITE every registered suite runs, in registration order (file
// name order; -h lists them). The founding ones: floor (cache-line and
// futex round trips between two processes, single-core copy() bandwidth)
// and ring (shm ring ping-pong in busy-poll and block mode, one-way
// streaming). When the two numbers of a target ratio were both measured, the
// ratio is printed with PASS or MISS.
//
// # Output
//
// Latency is half a round trip in nanoseconds (min, median, p99, p99.9),
// timed per round trip with one monotonic clock read each (the header line
// says what one read costs, ~30 ns on a KVM guest with the tsc clock
// source; the floors pay it too). Bandwidth is payload GB/s (1e9 bytes/s),
// rate million messages/s. The preempt column counts involuntary context
// switches of the two measuring threads during the row's measurement,
// warm-up included: busy-polling needs its CPUs, and a row with thousands
// was disturbed by other work (the targets section then warns).
// With -json FILE every number becomes one record:
//
//	{"suite":"ring","case":"pingpong","transport":"ring/busy","size":8,"metric":"lat_p50_ns","value":61.2}
//
// Metrics: lat_min_ns, lat_p50_ns, lat_p99_ns, lat_p999_ns, bw_gbps,
// rate_mps. Transports: cacheline, futex, memcpy, ring/busy, ring/block.
// Other tools read these names: keep them stable.
//
// # Adding a suite
//
// A suite is one file: an init that calls register with a Suite (name, one
// line of doc, Run) and registerPeer for the role its peer process plays.
// Run creates its shared segments, starts the peer with startPeer (the
// segments become the peer's fds 4, 5, …), and for each measurement calls
// peer.run with a command, a function that aborts the parent's side, and
// the parent's side itself, usually wrapped in pinned. The peer role serves
// commands with peerConn.serve: attach, ready, take part, return. newSampler,
// summarize, throughput and Env.Report do the rest; a ratio between two
// records of one run goes into targets.
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
// exits with status 1. With -json the records measured before a failure are
// still written.
package main
