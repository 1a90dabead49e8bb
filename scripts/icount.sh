#!/usr/bin/env bash
# icount.sh: instructions per benchmark op of our own code, counted by
# valgrind's callgrind — a number that does not move with the host's load,
# for changes too small to see in wall-clock time on a shared machine
# (docs/performance.md, "Counting instructions").
#
#   scripts/icount.sh PKG BENCH [TESTBINARY...]
#
# Without test binaries it builds PKG's (go test -c). For each binary it
# runs BENCH at 100,000 and at 300,000 iterations under callgrind and
# prints, per op, the instructions of functions of this module (and
# memmove) from the difference of the two runs, so set-up and background
# work cancel out. ICOUNT_TOP=N also lists the N costliest functions.
# Two runs of one binary agree within about 0.3%.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 PKG BENCH [TESTBINARY...]" >&2; exit 2; }
pkg=$1 bench=$2
shift 2
command -v valgrind >/dev/null || { echo "icount: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# As root, the library loads its eBPF monitor in a background thread at
# the lowest priority; under callgrind, which runs one thread at a time,
# that thread holds everyone up past the handshake's timeout. Our own
# code's instructions do not depend on the monitor: count them as an
# unprivileged user (the monitor falls back to userfaultfd).
as=()
if [ "$(id -u)" = 0 ]; then
	chmod 0777 "$tmp"
	as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
	go test -c -o "$tmp/pkg.test" "$pkg"
	bins=("$tmp/pkg.test")
fi
for i in "${!bins[@]}"; do # readable by the unprivileged user too
	cp "${bins[$i]}" "$tmp/bin$i.test"
	chmod 0755 "$tmp/bin$i.test"
done
for i in "${!bins[@]}"; do
	bin=${bins[$i]}
	for n in 100000 300000; do
		# Go preempts with signals, which callgrind mishandles; and
		# valgrind does not decode RDTSCP, which Go's runtime uses for
		# its clock where the CPU has it.
		(cd "$tmp" && GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off "${as[@]}" valgrind --tool=callgrind \
			--callgrind-out-file="$tmp/cg.$n" "$tmp/bin$i.test" -test.run '^$' -test.bench "$bench" \
			-test.benchtime "${n}x" >"$tmp/out.$n" 2>&1) ||
			{ echo "icount: $bin failed under callgrind:" >&2; tail -20 "$tmp/out.$n" >&2; exit 1; }
		callgrind_annotate --threshold=100 "$tmp/cg.$n" >"$tmp/ann.$n" 2>/dev/null
	done
	python3 - "$tmp/ann.100000" "$tmp/ann.300000" "$bin" "${ICOUNT_TOP:-0}" <<'EOF'
import collections, re, sys
def load(path):
    d = collections.Counter()
    for line in open(path):
        m = re.match(r'\s*([\d,]+)\s+\(.*?\)\s+\S+?:(\S+)', line)
        if not m:
            continue
        fn = re.sub(r"'\d+$", "", m.group(2))
        if 'sandirect/sandirect' in fn or fn == 'runtime.memmove':
            d[fn.replace('github.com/sandirect/sandirect/', '')] += int(m.group(1).replace(',', ''))
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
per = {k: (b[k] - a.get(k, 0)) / 200000 for k in b}
print('%s: %.0f instructions/op' % (sys.argv[3], sum(per.values())))
for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:int(sys.argv[4])]:
    print('%9.1f  %s' % (v, k))
EOF
done
