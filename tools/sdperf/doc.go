// Sdperf measures sandirect's emulated NIC the way perftest (ib_send_lat,
// ib_write_bw, …) measures an RDMA NIC, and prints perftest's tables, so
// shared-memory results sit beside real RDMA results.
//
// Usage:
//
//	sdperf TEST [flags]            server: listens, serves one run, exits
//	sdperf TEST [flags] ADDRESS    client: connects to a server started with the same words
//
// TEST is one of send_lat, write_lat, read_lat, send_bw, write_bw, read_bw.
// `sdperf -h` documents every flag and environment variable.
//
// # What is measured
//
// As in perftest:
//
//   - send_lat: send ping-pong; each side stamps its posts, and the latency
//     is half the time between two consecutive posts.
//   - write_lat: RDMA Write ping-pong; each side polls the last byte of its
//     own buffer for the peer's write; half round trip.
//   - read_lat: the client RDMA-Reads and waits for the completion; the time
//     between consecutive posts, not halved (a read is a round trip).
//   - *_bw: the client keeps up to 128 operations in flight (TX depth) for
//     -n iterations; average = bytes / (last completion − first post), peak
//     = the best rate over windows ending at a CQ-moderation boundary (100),
//     MB = 2^20 bytes.
//
// Latency statistics follow perftest's print_report_lat: the n−1 deltas are
// sorted, the two largest are dropped, t_typical is the median of the rest,
// t_max and the percentiles are taken at perftest's indices. One deviation:
// t_stdev is computed in floating point (perftest truncates each deviation
// to an integer number of microseconds).
//
// # Protocol
//
// The client dials the server's queue-pair listener (nic.Device.Listen). The
// first send each way carries the test parameters (test, sizes, iterations)
// and the exposed buffer (address, rkey, length); a mismatch fails both
// sides with the two command lines. After every size the client sends its
// row and the server answers "ready" when it is done with the size; the
// server prints its own row where it takes part in the timing and the
// client's row where it only serves memory. See wire.go.
package main
