#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine of this kind: installs what
# the tests need, then vet and the tests under the race detector (fuzz
# targets run their seed corpora; cross-process tests re-exec the test
# binary), then the eBPF tests again on a second kernel (Debian 6.1 under
# qemu; SANDIRECT_SKIP_VM=1 skips that part).
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

go mod download
go vet ./...
# As root on a kernel with BTF the eBPF tests must run for real, not skip.
if [ "$(id -u)" = 0 ] && [ -e /sys/kernel/btf/vmlinux ]; then
	export SANDIRECT_REQUIRE_EBPF="${SANDIRECT_REQUIRE_EBPF:-tp_btf,raw_tracepoint,tracepoint}"
fi
go test -race -count=1 -timeout 25m "$@" ./...

if [ "${SANDIRECT_SKIP_VM:-}" != 1 ]; then
	bash scripts/vmtest.sh ./internal/bpfmon
	bash scripts/vmtest.sh -run 'StaleHit|MonitorChoice' ./pin
fi
