//go:build linux

package sys

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Seal bits of F_ADD_SEALS / F_GET_SEALS.
const (
	SealSeal   = unix.F_SEAL_SEAL
	SealShrink = unix.F_SEAL_SHRINK
	SealGrow   = unix.F_SEAL_GROW
	SealWrite  = unix.F_SEAL_WRITE
	// SealFutureWrite forbids new writable mappings and write(2); mappings
	// made before it stay writable (Linux 5.1).
	SealFutureWrite = unix.F_SEAL_FUTURE_WRITE
)

// PageSize is the system page size.
var PageSize = os.Getpagesize()

// MemfdCreate creates an anonymous, sealable, close-on-exec memory file.
func MemfdCreate(name string) (int, error) {
	return unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
}

// Ftruncate sets the size of fd.
func Ftruncate(fd int, size int64) error { return unix.Ftruncate(fd, size) }

// AddSeals adds seals to a memfd.
func AddSeals(fd int, seals int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
	return err
}

// GetSeals returns the seals of fd; EINVAL means fd does not support sealing.
func GetSeals(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
}

// FileInfo is what Fstat tells about an fd that matters for mapping it.
type FileInfo struct {
	Size    int64
	Regular bool
	UID     uint32
	Dev     uint64 // with Ino, which file this is: two fds of one
	Ino     uint64 // memfd have the same pair
}

// Fstat describes fd.
func Fstat(fd int) (FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return FileInfo{}, err
	}
	return FileInfo{Size: st.Size, Regular: st.Mode&unix.S_IFMT == unix.S_IFREG, UID: st.Uid, Dev: st.Dev, Ino: st.Ino}, nil
}

// MapShared maps length bytes of fd read-write and MAP_SHARED. With populate
// the pages are faulted in by the kernel before return (MAP_POPULATE).
func MapShared(fd int, length int, populate bool) ([]byte, error) {
	flags := unix.MAP_SHARED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	return unix.Mmap(fd, 0, length, unix.PROT_READ|unix.PROT_WRITE, flags)
}

// MapAnon maps length bytes of private anonymous memory.
func MapAnon(length int) ([]byte, error) {
	return unix.Mmap(-1, 0, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
}

// Munmap unmaps exactly the mapping b (as returned by a Map function).
func Munmap(b []byte) error { return unix.Munmap(b) }

// ProtectNone makes b's pages inaccessible (mprotect PROT_NONE): an access
// faults, and the range stays reserved, as an unmapped one does not.
func ProtectNone(b []byte) error { return unix.Mprotect(b, unix.PROT_NONE) }

// MunmapRange unmaps [addr, addr+length) without the bookkeeping of Munmap;
// for ranges that were not mapped through this package's Map functions.
func MunmapRange(addr, length uintptr) error {
	_, _, e := unix.Syscall(unix.SYS_MUNMAP, addr, length, 0)
	return errnoErr(e)
}

// Mlock locks [addr, addr+length) in memory.
func Mlock(addr, length uintptr) error {
	_, _, e := unix.Syscall(unix.SYS_MLOCK, addr, length, 0)
	return errnoErr(e)
}

// Munlock unlocks [addr, addr+length).
func Munlock(addr, length uintptr) error {
	_, _, e := unix.Syscall(unix.SYS_MUNLOCK, addr, length, 0)
	return errnoErr(e)
}

// Madvise advises the kernel about [addr, addr+length).
func Madvise(addr, length uintptr, advice int) error {
	_, _, e := unix.Syscall(unix.SYS_MADVISE, addr, length, uintptr(advice))
	return errnoErr(e)
}

// Mincore reports, one byte per page of b (page-aligned), whether the page
// is resident: for a shared file mapping, whether the file has the page,
// mapped here or not.
func Mincore(b []byte) ([]byte, error) {
	vec := make([]byte, (len(b)+PageSize-1)/PageSize)
	if len(b) == 0 {
		return vec, nil
	}
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	if err := errnoErr(e); err != nil {
		return nil, err
	}
	return vec, nil
}

// Madvise advice values used by the project.
const (
	MadvDontfork       = unix.MADV_DONTFORK
	MadvDofork         = unix.MADV_DOFORK
	MadvDontneed       = unix.MADV_DONTNEED
	MadvFree           = unix.MADV_FREE
	MadvRemove         = unix.MADV_REMOVE
	MadvDontneedLocked = 24 // MADV_DONTNEED_LOCKED, Linux 5.18
)

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// FutexWait sleeps while *addr == val, for at most timeoutNs nanoseconds
// (timeoutNs < 0: no limit). It uses the shared (not private) futex ops, so
// the word may live in memory mapped by several processes. It returns nil on
// a wake-up, EAGAIN when *addr != val, ETIMEDOUT or EINTR.
func FutexWait(addr *uint32, val uint32, timeoutNs int64) error {
	var tsp unsafe.Pointer
	var ts unix.Timespec
	if timeoutNs >= 0 {
		ts = unix.NsecToTimespec(timeoutNs)
		tsp = unsafe.Pointer(&ts)
	}
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val), uintptr(tsp), 0, 0)
	return errnoErr(e)
}

// FutexWake wakes at most n waiters on addr (shared futex op) and returns how
// many it woke.
func FutexWake(addr *uint32, n int) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(n), 0, 0, 0)
	return int(r), errnoErr(e)
}

// FutexWakePrivate is FutexWake for a word that only this process's
// threads wait on (FUTEX_PRIVATE_FLAG: the kernel keys it by address, with
// no page lookup). Its waiters must wait with the private flag too
// (FutexWaiter.SetPrivateWord).
func FutexWakePrivate(addr *uint32, n int) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake|futexPrivateFlag, uintptr(n), 0, 0, 0)
	return int(r), errnoErr(e)
}

// Futex operations (linux/futex.h); the shared variants, without
// FUTEX_PRIVATE_FLAG, since the word lives in memory several processes map.
const (
	futexWait        = 0
	futexWake        = 1
	futexPrivateFlag = 128
)

// ErrNoFds is returned by RecvFds when a message carried no descriptors.
var ErrNoFds = errors.New("message carried no file descriptors")

// SendFds sends msg with fds attached (SCM_RIGHTS) over c.
func SendFds(c *net.UnixConn, msg []byte, fds ...int) error {
	var oob []byte // no fds: no control message at all
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return err
	}
	if n != len(msg) || oobn != len(oob) {
		return fmt.Errorf("short write of fds message: %d/%d bytes, %d/%d oob", n, len(msg), oobn, len(oob))
	}
	return nil
}

// RecvFds receives one message of at most len(buf) bytes and at most maxFds
// descriptors from c. Received fds are close-on-exec. On error no fd is
// left open.
func RecvFds(c *net.UnixConn, buf []byte, maxFds int) (n int, fds []int, err error) {
	oob := make([]byte, unix.CmsgSpace(maxFds*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				got, rerr := unix.ParseUnixRights(&m)
				if rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	if err == nil && flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0 {
		err = fmt.Errorf("fd message truncated (flags %#x)", flags)
	}
	if err != nil {
		CloseAll(fds)
		return 0, nil, err
	}
	return n, fds, nil
}

// CloseAll closes every fd in fds, ignoring errors.
func CloseAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Close closes fd.
func Close(fd int) error { return unix.Close(fd) }

// Dup duplicates fd with close-on-exec set.
func Dup(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// PeerCred returns the pid, uid and gid of the process at the other end of a
// connected Unix socket.
func PeerCred(c *net.UnixConn) (pid int32, uid, gid uint32, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, 0, err
	}
	if cerr != nil {
		return 0, 0, 0, cerr
	}
	return cred.Pid, cred.Uid, cred.Gid, nil
}

// ProcessVMReadv copies len(local) bytes from remote address raddr of process
// pid into local. It returns the bytes copied.
func ProcessVMReadv(pid int, local []byte, raddr uintptr) (int, error) {
	if len(local) == 0 {
		return 0, nil
	}
	l := []unix.Iovec{{Base: &local[0]}}
	l[0].SetLen(len(local))
	r := []unix.RemoteIovec{{Base: raddr, Len: len(local)}}
	return unix.ProcessVMReadv(pid, l, r, 0)
}

// ProcessVMWritev copies local to remote address raddr of process pid. It
// returns the bytes copied.
func ProcessVMWritev(pid int, local []byte, raddr uintptr) (int, error) {
	if len(local) == 0 {
		return 0, nil
	}
	l := []unix.Iovec{{Base: &local[0]}}
	l[0].SetLen(len(local))
	r := []unix.RemoteIovec{{Base: raddr, Len: len(local)}}
	return unix.ProcessVMWritev(pid, l, r, 0)
}

// PidfdOpen returns a pidfd for pid (close-on-exec).
func PidfdOpen(pid int) (int, error) { return unix.PidfdOpen(pid, 0) }

// MemlockLimit returns the soft RLIMIT_MEMLOCK (RLIM_INFINITY as ^uint64(0)).
func MemlockLimit() (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, err
	}
	return r.Cur, nil
}

// SetMemlockLimit sets the soft and hard RLIMIT_MEMLOCK.
func SetMemlockLimit(cur, max uint64) error {
	return unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: cur, Max: max})
}

// HasCapIPCLock tells whether the process holds CAP_IPC_LOCK in its
// effective set (then RLIMIT_MEMLOCK does not bind mlock).
func HasCapIPCLock() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	const capIPCLock = unix.CAP_IPC_LOCK
	return data[capIPCLock/32].Effective&(1<<(capIPCLock%32)) != 0
}

// Gettid returns the calling thread's id.
func Gettid() int { return unix.Gettid() }

// Errno constants used by callers that must not import x/sys/unix.
const (
	EAGAIN    = unix.EAGAIN
	EINTR     = unix.EINTR
	ETIMEDOUT = unix.ETIMEDOUT
	ENOMEM    = unix.ENOMEM
	EINVAL    = unix.EINVAL
	ENOSYS    = unix.ENOSYS
	EPERM     = unix.EPERM
)

// UnixPair returns the two ends of a connected AF_UNIX stream socketpair as
// files (close-on-exec).
func UnixPair() (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "unixpair-0"), os.NewFile(uintptr(fds[1]), "unixpair-1"), nil
}

// MapSharedReadOnly maps length bytes of fd read-only and MAP_SHARED,
// pre-faulted: for tables a peer writes and this process only reads.
func MapSharedReadOnly(fd int, length int) ([]byte, error) {
	return unix.Mmap(fd, 0, length, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
}
