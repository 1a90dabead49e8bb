#!/usr/bin/env bash
# The main job: builds the benchmark harness and runs every suite in quick
# mode, two real processes per measurement, printing the side-by-side table
# and writing the JSON report. Usage: scripts/demo.sh [bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
go mod download
mkdir -p sandirect-report
go run ./bench -quick -json sandirect-report/bench.json "$@"
echo "report: $(pwd)/sandirect-report/bench.json"
