#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine of this kind: installs what
# the tests need, then vet, gofmt, staticcheck and a build of the library
# for darwin, then the tests under the race detector (fuzz
# targets run their seed corpora; cross-process tests re-exec the test
# binary), then the library's suites under the lock-rank checker
# (-tags lockrank) and with one processor (GOMAXPROCS=1), then the eBPF
# tests again on a second kernel (Debian 6.1 under qemu;
# SANDIRECT_SKIP_VM=1 skips that part).
# Usage: scripts/test.sh [go test flags...]
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PATH:/usr/local/go/bin:$(go env GOPATH 2>/dev/null || echo /root/go)/bin"
if ! command -v go >/dev/null; then
	echo "test.sh: Go is not installed (expected /usr/local/go)" >&2
	exit 1
fi

# eBPF tests attach syscall tracepoints, which need tracefs.
if [ "$(id -u)" = 0 ] && [ -d /sys/kernel/tracing ] && [ ! -e /sys/kernel/tracing/events ]; then
	mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi

# The bench's peers, UCX's ucx_perftest and libfabric's fi_pingpong: their
# end-to-end tests run for real where they could be installed, and fail
# rather than skip once they are.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null &&
	{ ! command -v ucx_perftest >/dev/null || ! command -v fi_pingpong >/dev/null; }; then
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ucx-utils libfabric-bin; } >/dev/null 2>&1 ||
		echo "test.sh: could not install ucx-utils libfabric-bin: the bench's peer tests skip" >&2
fi
if command -v ucx_perftest >/dev/null && command -v fi_pingpong >/dev/null; then
	export SANDIRECT_BENCH_REQUIRE_PEERS="${SANDIRECT_BENCH_REQUIRE_PEERS:-1}"
fi

go mod download
go vet ./...
# Static checks: gofmt, staticcheck (pinned; the version is its module's),
# and the library built for a system other than Linux, where every system
# call fails with ErrNotSupported (internal/sys/sys_other.go). The layering
# and function length are tests (internal/codecheck).
staticcheck_version=v0.8.2 # staticcheck 2026.2.2
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "test.sh: not gofmt'd:" $unformatted >&2
	exit 1
fi
if [ "$(staticcheck -version 2>/dev/null | sed -n 's/.*(\(.*\))$/v\1/p')" != "$staticcheck_version" ]; then
	go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
fi
staticcheck ./...
staticcheck -tags lockrank ./internal/lockrank # the checker itself, built only so
GOOS=darwin go build ./shm/... ./pin/... ./nic/... ./sockets/... ./stats/... ./internal/...
GOOS=darwin go vet ./internal/sys
# As root on a kernel with BTF the eBPF tests must run for real, not skip.
if [ "$(id -u)" = 0 ] && [ -e /sys/kernel/btf/vmlinux ]; then
	export SANDIRECT_REQUIRE_EBPF="${SANDIRECT_REQUIRE_EBPF:-tp_btf,raw_tracepoint,tracepoint}"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# gotest NAME FLAGS...: go test ./... under the race detector. A package that
# fails is run once more, so that a flaky test (a bug to fix, named here)
# is told apart from a broken build; a second failure fails the run.
gotest() {
	local name=$1
	shift
	echo "== $name"
	if ! go test -race -count=1 "$@" ./... 2>&1 | tee "$log"; then
		failed=$(awk '$1 == "FAIL" && $2 ~ /^github.com\// {print $2}' "$log" | sort -u)
		[ -n "$failed" ] || exit 1
		echo "test.sh: $name: FLAKY OR BROKEN, running again once: $failed" >&2
		go test -race -count=1 "$@" $failed
	fi
}
# The reliability campaign (issue 8, docs/security.md): its tests are
# named TestCampaign… and run as their own step, short variants (the
# soak's long run: SANDIRECT_SOAK_BYTES=10G go test -run TestCampaignSoak
# ./sockets).
gotest "unit and integration tests" -timeout 25m -skip '^TestCampaign' "$@"
gotest "reliability campaign (short)" -timeout 15m -run '^TestCampaign' "$@"
# The lock ranks of docs/locking.md, checked at every Lock (internal/lockrank):
# a lock taken out of order panics, and fails the run at once.
# Failures other than an order violation get one more run, as gotest's do.
echo "== lock ranks"
lockpkgs=(./shm/... ./internal/bpfmon/... ./pin/... ./nic/... ./sockets/... ./stats/...)
lockskip='^TestCampaign'
if ! go test -tags lockrank -count=1 -skip "$lockskip" "${lockpkgs[@]}" 2>&1 | tee "$log"; then
	failed=$(awk '$1 == "FAIL" && $2 ~ /^github.com\// {print $2}' "$log" | sort -u)
	if [ -z "$failed" ] || grep -q "lock order: " "$log"; then
		exit 1
	fi
	echo "test.sh: lock ranks: FLAKY OR BROKEN, running again once: $failed" >&2
	go test -tags lockrank -count=1 -skip "$lockskip" $failed
fi

# One processor (GOMAXPROCS=1, what a container given one CPU runs with):
# nothing in the library may need two goroutines running at once to make
# progress. Tests that race two threads on purpose skip there.
echo "== one processor"
if ! GOMAXPROCS=1 go test -count=1 -skip "$lockskip" "${lockpkgs[@]}" 2>&1 | tee "$log"; then
	failed=$(awk '$1 == "FAIL" && $2 ~ /^github.com\// {print $2}' "$log" | sort -u)
	[ -n "$failed" ] || exit 1
	echo "test.sh: one processor: FLAKY OR BROKEN, running again once: $failed" >&2
	GOMAXPROCS=1 go test -count=1 -skip "$lockskip" $failed
fi

# The modules of their own, whose dependencies (gonum/plot, gRPC) stay out
# of the library's go.mod: the report's plotting, the bench's app suite,
# the examples (the gRPC service test among them).
for mod in bench/plot bench/app examples; do
	(cd "$mod" && export GOWORK=off && go mod download && go vet ./... && gotest "module $mod" -timeout 10m "$@")
done

if [ "${SANDIRECT_SKIP_VM:-}" != 1 ]; then
	bash scripts/vmtest.sh ./internal/bpfmon
	bash scripts/vmtest.sh -run 'StaleHit|MonitorChoice' ./pin
	bash scripts/vmtest.sh ./tools/sdtrace
fi
