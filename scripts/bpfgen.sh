#!/usr/bin/env bash
# Regenerates the committed BPF objects of internal/bpfmon and tools/sdtrace
# from their bpf/*.c (bpf2go v0.22.0), installing clang, llvm and
# libbpf-dev first when clang is missing. Building the project never needs
# this: the generated .o and .go files are committed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang >/dev/null || [ ! -e /usr/include/bpf/bpf_helpers.h ]; then
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends clang llvm libbpf-dev >/dev/null
fi
go generate ./internal/bpfmon ./tools/sdtrace
git status --short internal/bpfmon tools/sdtrace
