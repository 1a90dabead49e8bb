// Command sdstat shows the counters that running sandirect processes
// publish in shared memory (package stats): devices, queue pairs, the
// registration cache, connections. It maps each process's table read-only
// and never stops, signals or slows the process.
//
// Processes are found through their abstract endpoints in /proc/net/unix
// (stats.List), which vanish when a process dies. One shot prints every
// process's table; -p reads one process; -watch prints again every interval
// with rates per second (from the publisher's own refresh times); -json
// prints JSON objects instead of tables, one per line with -watch.
//
// Run "sdstat -h" for the flags and environment variables.
package main
