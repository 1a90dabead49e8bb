#!/usr/bin/env bash
# The main job: builds sandirect's benchmark harness and runs every suite in
# quick mode (a minute or two), two real processes per measurement: our
# transport (sockets/busy, sockets/block, sockets/default, sockets/forcetcp)
# side by side with UCX and libfabric over shared memory, a Unix socket, TCP
# loopback, a pipe, cloudwego/shmipc-go and the floors
# (cache-line and futex round trips, single-core copy, raw
# process_vm_readv/writev), and Go applications (gRPC-go and net/http over
# sandirect, a Unix socket and TCP; the threads of idle connections). It
# prints the tables, the targets and the paths of the report:
# sandirect-report/ in the current directory (bench.json and a plot per
# suite, SVG and PNG).
#
#   scripts/demo.sh [bench flags] [SUITE...]     e.g. -out /tmp/r, conn, -h
#
# Needs Go 1.26 (PATH, or /usr/local/go/bin) and, the first time, the Go
# module proxy for the dependencies. Run as root for the eBPF monitor of the
# pin suite (it says why it skips otherwise). The peers UCX (ucx_perftest)
# and libfabric (fi_pingpong) come from Debian's ucx-utils and
# libfabric-bin: installed here when missing and run as root; else the
# suites leave them out and say so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null; then
	echo "demo: no go command: install Go 1.26 (https://go.dev/dl/)" >&2
	exit 1
fi
# The peers' benchmark programs, rows ucx/* and ofi/shm.
peers="ucx-utils libfabric-bin"
if ! command -v ucx_perftest >/dev/null || ! command -v fi_pingpong >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "# installing the peers' benchmarks ($peers)" >&2
		if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $peers; } >/dev/null 2>&1; then
			echo "demo: could not install $peers: the UCX and libfabric rows are left out" >&2
		fi
	else
		echo "demo: no ucx_perftest or fi_pingpong: the UCX and libfabric rows are left out (as root: apt-get install $peers)" >&2
	fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# building the benchmark harness ($(go version | cut -d' ' -f3))" >&2
go build -C "$root" -o "$tmp/bench" ./bench
# The harness builds its modules of their own itself: shmipc-go's for the
# conn suite (bench/shmipc), gRPC's for the app suite (bench/app), and the
# report's plotting (bench/plot).
export SANDIRECT_BENCH_SHMIPC="${SANDIRECT_BENCH_SHMIPC:-$root/bench/shmipc}"
export SANDIRECT_BENCH_APP="${SANDIRECT_BENCH_APP:-$root/bench/app}"
export SANDIRECT_BENCH_PLOT="${SANDIRECT_BENCH_PLOT:-$root/bench/plot}"
"$tmp/bench" -quick "$@"
