//go:build linux

package sys

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// HugePage is the size of a transparent huge page (x86-64 and arm64 with
// 4 KiB base pages): the alignment CollapseHuge works in.
const HugePage = 2 << 20

// madvCollapse is MADV_COLLAPSE (Linux 6.1).
const madvCollapse = 25

// HugeRange returns the part of b that CollapseHuge can back with huge
// pages: the whole HugePage-aligned blocks inside it (length 0 if none).
func HugeRange(b []byte) (addr, length uintptr) {
	lo := (Addr(b) + HugePage - 1) &^ (HugePage - 1)
	hi := (Addr(b) + uintptr(len(b))) &^ (HugePage - 1)
	if len(b) == 0 || hi <= lo {
		return 0, 0
	}
	return lo, hi - lo
}

// CollapseHuge asks the kernel to back the HugePage-aligned blocks inside
// b with transparent huge pages now (MADV_COLLAPSE), and returns how many
// bytes of b they cover. The contents do not change; pages the kernel
// has not populated yet are populated. It works in the madvise and
// always modes of /sys/kernel/mm/transparent_hugepage/enabled and on
// mlocked memory; on a range already so backed it returns at once.
//
// Why it matters here: process_vm_readv and process_vm_writev pin the
// other process's pages one by one before they copy, and with 4 KiB pages
// that costs more than the copy (docs/protocol.md, "Split transfers";
// docs/performance.md).
//
// The error is from madvise: EINVAL when the kernel cannot collapse (too
// old, transparent huge pages disabled, or a block with no page present
// yet), EAGAIN or ENOMEM when some block could not be collapsed now. A
// failure costs a system call of a few microseconds.
func CollapseHuge(b []byte) (int, error) {
	addr, length := HugeRange(b)
	if length == 0 {
		return 0, nil
	}
	_, _, e := unix.Syscall(unix.SYS_MADVISE, addr, length, madvCollapse)
	if e != 0 {
		return 0, e
	}
	return int(length), nil
}

// AnonHugeBytes returns the anonymous memory that huge pages back in the
// mapping of this process that contains addr (AnonHugePages in
// /proc/self/smaps).
func AnonHugeBytes(addr uintptr) (int64, error) {
	raw, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Bytes()
		if lo, hi, ok := smapsRange(line); ok {
			in = lo <= addr && addr < hi
			continue
		}
		if !in || !bytes.HasPrefix(line, []byte("AnonHugePages:")) {
			continue
		}
		f := bytes.Fields(line)
		if len(f) < 2 {
			break
		}
		kb, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("smaps: %q: %w", line, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("smaps: no mapping contains %#x", addr)
}

// smapsRange parses the range of a mapping's first line in smaps
// ("lo-hi perms ...").
func smapsRange(line []byte) (lo, hi uintptr, ok bool) {
	f := bytes.Fields(line)
	if len(f) < 2 {
		return 0, 0, false
	}
	a, b, found := bytes.Cut(f[0], []byte("-"))
	if !found {
		return 0, 0, false
	}
	l, err1 := strconv.ParseUint(string(a), 16, 64)
	h, err2 := strconv.ParseUint(string(b), 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uintptr(l), uintptr(h), true
}
