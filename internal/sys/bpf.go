//go:build linux

package sys

import (
	"golang.org/x/sys/unix"
)

// What the eBPF monitor (internal/bpfmon) and its tests need: mappings of
// BPF map fds at an offset, capabilities, tracefs, SysV shared memory.

// MapFd maps length bytes of fd from offset off, MAP_SHARED, read-write or
// read-only. Unmap with Munmap.
func MapFd(fd int, off int64, length int, writable bool) ([]byte, error) {
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	return unix.Mmap(fd, off, length, prot, unix.MAP_SHARED)
}

// SetNonblock puts fd in non-blocking mode.
func SetNonblock(fd int) error { return unix.SetNonblock(fd, true) }

// Capabilities tested by HasCap.
const (
	CapSysAdmin = unix.CAP_SYS_ADMIN
	CapPerfmon  = unix.CAP_PERFMON // Linux 5.8
	CapBPF      = unix.CAP_BPF     // Linux 5.8
)

// HasCap tells whether the process holds capability c in its effective set.
func HasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil || c < 0 || c >= 64 {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// TracefsMagic is the f_type of a mounted tracefs.
const TracefsMagic = unix.TRACEFS_MAGIC

// FsType returns the f_type of the file system that holds path.
func FsType(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return st.Type, nil
}

// MountTracefs mounts tracefs at dir.
func MountTracefs(dir string) error {
	return unix.Mount("nodev", dir, "tracefs", 0, "")
}

// KernelRelease returns the running kernel's release (uname -r).
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// ShmGet creates a private SysV shared memory segment of size bytes, mode
// 0600.
func ShmGet(size int) (int, error) {
	return unix.SysvShmGet(unix.IPC_PRIVATE, size, unix.IPC_CREAT|0o600)
}

// ShmAt attaches segment id at addr (0: the kernel chooses) read-write and
// returns the address. Detach with ShmDt.
func ShmAt(id int, addr uintptr) (uintptr, error) {
	r, _, e := unix.Syscall(unix.SYS_SHMAT, uintptr(id), addr, 0)
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// ShmDt detaches the segment attached at addr.
func ShmDt(addr uintptr) error {
	_, _, e := unix.Syscall(unix.SYS_SHMDT, addr, 0, 0)
	return errnoErr(e)
}

// ShmRemove marks segment id for removal (IPC_RMID): it goes away at its
// last detach.
func ShmRemove(id int) error {
	_, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	return err
}

// MonotonicNanos returns CLOCK_MONOTONIC in nanoseconds: the clock of
// bpf_ktime_get_ns, for converting BPF timestamps to wall time.
func MonotonicNanos() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
