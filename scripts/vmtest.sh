#!/usr/bin/env bash
# Runs Go test packages inside qemu on Debian's 6.1 cloud kernel, so that
# the eBPF monitor is tested for real on a second kernel (there kprobes,
# which the host lacks, exist too).
#
# Usage: scripts/vmtest.sh [-run REGEXP] [PACKAGE...]   (default ./internal/bpfmon)
#
# Installs qemu-system-x86 when missing; downloads (apt-get download, not
# install) the newest linux-image-6.1.0-*-cloud-amd64 and unpacks it into
# .vmcache/; builds each package's tests statically (CGO_ENABLED=0 go test
# -c) and scripts/vminit as /init of an initramfs; boots it under TCG with
# one CPU (two CPUs under TCG hang at attach now and then) and a hard
# timeout. Exits with the tests' status. The serial console goes to stdout
# and .vmcache/last.log.
#
# Environment: VMTEST_TIMEOUT (seconds, default 300), VMTEST_KERNEL (a
# linux-image package name, default the newest 6.1 cloud kernel),
# VMTEST_REQUIRE (attach methods the tests must find, default "all"),
# VMTEST_BENCH, VMTEST_BENCHTIME and VMTEST_COUNT (go test's -bench,
# -benchtime and -count: benchmarks on that kernel, for instance
# VMTEST_BENCH=Getpid scripts/vmtest.sh -run '^$', what an attached
# monitor costs an unrelated system call with each attach method).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

run=""
if [ "${1:-}" = "-run" ]; then
	run="$2"
	shift 2
fi
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./internal/bpfmon)
timeout_s="${VMTEST_TIMEOUT:-300}"
cache=.vmcache
start=$(date +%s)
mkdir -p "$cache"

log() { echo "vmtest: $*" >&2; }

updated=""
apt_update() {
	if [ -z "$updated" ]; then
		apt-get update -qq
		updated=1
	fi
}

if ! command -v qemu-system-x86_64 >/dev/null; then
	log "installing qemu-system-x86"
	apt_update
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
fi

newest_kernel() {
	apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-cloud-amd64$' 2>/dev/null |
		awk '{print $1}' | sort -V | tail -1
}
kpkg="${VMTEST_KERNEL:-}"
if [ -z "$kpkg" ]; then
	kpkg=$(newest_kernel)
	if [ -z "$kpkg" ]; then
		apt_update
		kpkg=$(newest_kernel)
	fi
fi
if [ -z "$kpkg" ]; then
	# No package lists at all: use a kernel unpacked before, if any.
	kdir=$(ls -d "$cache"/linux-image-6.1.0-*-cloud-amd64 2>/dev/null | sort -V | tail -1 || true)
	[ -n "$kdir" ] || { log "no linux-image-6.1.0-*-cloud-amd64 package found"; exit 1; }
	kpkg=$(basename "$kdir")
fi
kdir="$cache/$kpkg"
if ! ls "$kdir"/boot/vmlinuz-* >/dev/null 2>&1; then
	log "downloading $kpkg"
	rm -rf "$kdir" "$cache/dl"
	mkdir -p "$cache/dl"
	(cd "$cache/dl" && apt-get download -qq "$kpkg" 2>/dev/null) || {
		apt_update
		(cd "$cache/dl" && apt-get download -qq "$kpkg")
	}
	dpkg-deb -x "$cache"/dl/"$kpkg"_*.deb "$kdir"
	rm -rf "$cache/dl"
fi
vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -1)

root="$cache/initramfs"
rm -rf "$root"
mkdir -p "$root/tests" "$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/bin"
log "building tests of ${pkgs[*]}"
CGO_ENABLED=0 go build -o "$cache/vminit" ./scripts/vminit
cp "$cache/vminit" "$root/init"
for p in "${pkgs[@]}"; do
	name=$(go list -f '{{.ImportPath}}' "$p" | tr / _)
	CGO_ENABLED=0 go test -c -o "$root/tests/$name.test" "$p"
done
{
	echo "-test.timeout=$((timeout_s - 30))s"
	echo "-test.short" # TCG runs ~20x slower than the host
	[ -z "$run" ] || echo "-test.run=$run"
	[ -z "${VMTEST_BENCH:-}" ] || echo "-test.bench=$VMTEST_BENCH"
	[ -z "${VMTEST_BENCHTIME:-}" ] || echo "-test.benchtime=$VMTEST_BENCHTIME"
	[ -z "${VMTEST_COUNT:-}" ] || echo "-test.count=$VMTEST_COUNT"
} >"$root/tests/args"
"$cache/vminit" pack "$cache/initramfs.cpio" "$root"

log "booting $kpkg under qemu (timeout ${timeout_s}s)"
status=0
timeout --foreground -k 10 "$timeout_s" qemu-system-x86_64 \
	-accel tcg -machine q35 -cpu max -smp 1 -m 1G \
	-kernel "$vmlinuz" -initrd "$cache/initramfs.cpio" \
	-append "console=ttyS0 panic=-1 quiet SANDIRECT_REQUIRE_EBPF=${VMTEST_REQUIRE:-all}" \
	-nographic -no-reboot -nic none </dev/null 2>&1 | tr -d '\r' | tee "$cache/last.log" || status=$?

elapsed=$(($(date +%s) - start))
count() { grep -c -E "^ *--- $1:" "$cache/last.log" || true; }
echo "vmtest: $(count PASS) passed, $(count FAIL) failed, $(count SKIP) skipped"
if grep -q '^VMTEST-RESULT: PASS' "$cache/last.log"; then
	log "PASS on $kpkg in ${elapsed}s"
	exit 0
fi
if [ "$status" = 124 ]; then
	log "FAIL: timed out after ${timeout_s}s on $kpkg"
else
	log "FAIL on $kpkg in ${elapsed}s ($(grep -o '^VMTEST-RESULT: .*' "$cache/last.log" || echo 'no result line'))"
fi
exit 1
