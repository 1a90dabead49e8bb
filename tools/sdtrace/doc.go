// Command sdtrace traces a running sandirect process with eBPF:
// registrations and registration-cache hits and misses, invalidations with
// the system call that caused them, and transfers (nic work requests,
// sockets Reads and Writes) with sizes and latency, as an event stream
// (text or -json) and log2 latency histograms like bcc's funclatency.
//
// Where the kernel has uprobes it puts one at the entry of each traced
// function of the library in the target's binary (resolved by symbol from
// /proc/PID/exe) and reads the arguments from the registers by Go's amd64
// register ABI (probes.go). The traced functions are exported methods and
// trace points: empty functions with plain integer arguments that pin,
// nic and sockets keep stable for this tool (their trace.go files), never
// internal methods that a refactor may rename or inline. It never uses return probes, which kill Go
// programs: a latency is the time between two entry probes, paired by
// goroutine (R14) or by queue pair and work request id. The causes of
// invalidations come from the registration cache monitor's system call
// probes (internal/bpfmon), filtered to the target. Where uprobes cannot
// run, it falls back to those system call probes and the counters the
// process publishes (package stats, as sdstat reads them).
//
// Run "sdtrace -h" for the flags and environment variables.
package main
