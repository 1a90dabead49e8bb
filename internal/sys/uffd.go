//go:build linux

package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// userfaultfd(2) and its ioctls (linux/userfaultfd.h). x/sys/unix has the
// system call number only; the ABI below is stable since Linux 4.3.

// Flags of Userfaultfd.
const (
	UffdUserModeOnly = 1 // UFFD_USER_MODE_ONLY, Linux 5.11: no faults from kernel mode; no privilege needed
)

// Feature bits of UFFDIO_API. The values matter: a wrong bit (1<<1 is
// EVENT_FORK) silently yields no events of the kind wanted.
const (
	UffdFeatureEventRemap  = 1 << 2 // UFFD_FEATURE_EVENT_REMAP, Linux 4.11
	UffdFeatureEventRemove = 1 << 3 // UFFD_FEATURE_EVENT_REMOVE, Linux 4.11
	UffdFeatureEventUnmap  = 1 << 6 // UFFD_FEATURE_EVENT_UNMAP, Linux 4.11
)

// Registration modes of UFFDIO_REGISTER.
const (
	UffdRegisterModeMissing = 1 // UFFDIO_REGISTER_MODE_MISSING
	UffdRegisterModeWP      = 2 // UFFDIO_REGISTER_MODE_WP, Linux 5.7 (anonymous)
)

// Event kinds in UffdMsg.Event.
const (
	UffdEventPagefault = 0x12
	UffdEventFork      = 0x13
	UffdEventRemap     = 0x14 // A0 from, A1 to, A2 old length
	UffdEventRemove    = 0x15 // A0 start, A1 end
	UffdEventUnmap     = 0x16 // A0 start, A1 end
)

const (
	uffdAPI = 0xAA
	// _IOWR(0xAA, 0x3F, struct uffdio_api{api, features, ioctls u64})
	uffdioAPI = 3<<30 | 24<<16 | 0xAA<<8 | 0x3F
	// _IOWR(0xAA, 0x00, struct uffdio_register{range{start,len}, mode, ioctls})
	uffdioRegister = 3<<30 | 32<<16 | 0xAA<<8 // nr 0x00
	// _IOR(0xAA, 0x01, struct uffdio_range{start, len})
	uffdioUnregister = 2<<30 | 16<<16 | 0xAA<<8 | 0x01
)

// UffdMsg is struct uffd_msg (32 bytes, packed): the event kind, then three
// 64-bit arguments whose meaning depends on the kind.
type UffdMsg struct {
	Event uint8
	_     [7]uint8
	A0    uint64
	A1    uint64
	A2    uint64
}

var _ [32 - unsafe.Sizeof(UffdMsg{})]struct{} // the ABI size

// Userfaultfd opens a userfaultfd, close-on-exec and non-blocking (a
// blocking one polls as POLLERR), with extra flags such as UffdUserModeOnly.
func Userfaultfd(flags int) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_USERFAULTFD, uintptr(unix.O_CLOEXEC|unix.O_NONBLOCK|flags), 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// UffdAPI does the UFFDIO_API handshake asking for features and returns the
// features the kernel grants. It can be done once per fd.
func UffdAPI(fd int, features uint64) (uint64, error) {
	api := [3]uint64{uffdAPI, features, 0}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uffdioAPI, uintptr(unsafe.Pointer(&api)))
	if e != 0 {
		return 0, e
	}
	return api[1], nil
}

// UffdRegister registers [addr, addr+length) (page-aligned) with fd in mode.
func UffdRegister(fd int, addr, length uintptr, mode uint64) error {
	reg := [4]uint64{uint64(addr), uint64(length), mode, 0}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uffdioRegister, uintptr(unsafe.Pointer(&reg)))
	return errnoErr(e)
}

// UffdUnregister unregisters [addr, addr+length) from fd.
func UffdUnregister(fd int, addr, length uintptr) error {
	rng := [2]uint64{uint64(addr), uint64(length)}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uffdioUnregister, uintptr(unsafe.Pointer(&rng)))
	return errnoErr(e)
}

// UffdRead reads as many pending messages as fit in msgs. It returns EAGAIN
// when none is pending. Reading a message is what lets the thread that
// raised it (munmap, mremap, madvise) go on.
func UffdRead(fd int, msgs []UffdMsg) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&msgs[0])), len(msgs)*int(unsafe.Sizeof(UffdMsg{})))
	n, err := unix.Read(fd, b)
	if err != nil {
		return 0, err
	}
	return n / int(unsafe.Sizeof(UffdMsg{})), nil
}

// Eventfd opens a non-blocking, close-on-exec eventfd.
func Eventfd() (int, error) {
	return unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
}

// EventfdSignal adds one to an eventfd.
func EventfdSignal(fd int) error {
	one := [8]byte{1}
	_, err := unix.Write(fd, one[:])
	return err
}

// Pipe opens a non-blocking, close-on-exec pipe: the read end, then the
// write end.
func Pipe() (r, w int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return -1, -1, err
	}
	return p[0], p[1], nil
}

// signalByte is what PipeSignal writes.
var signalByte = [1]byte{1}

// PipeSignal writes one byte to the write end of a pipe. A full pipe
// (EAGAIN) is readable already: the signal is not needed. The pipe is
// non-blocking, so the write never sleeps: it goes as a raw system call,
// without the scheduler's hand-off of the processor around it (and the
// wake-up of its monitor thread that entering a system call may cost).
func PipeSignal(fd int) error {
	_, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&signalByte[0])), 1)
	switch e {
	case 0, unix.EAGAIN:
		return nil
	}
	return e
}

// PipeDrain reads what a non-blocking pipe holds, without waiting (raw
// system calls, as PipeSignal's).
func PipeDrain(fd int) {
	var b [256]byte
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e != 0 || n < uintptr(len(b)) {
			return
		}
	}
}

// Poll readiness results of PollIn.
const (
	PollReady = 1 << iota // POLLIN
	PollError             // POLLERR, POLLHUP or POLLNVAL
)

// PollIn waits, without a time limit, until a or b is readable and returns
// the readiness of each (PollReady, PollError). It returns EINTR when
// interrupted.
func PollIn(a, b int) (ra, rb int, err error) {
	fds := [2]unix.PollFd{{Fd: int32(a), Events: unix.POLLIN}, {Fd: int32(b), Events: unix.POLLIN}}
	if _, err := unix.Poll(fds[:], -1); err != nil {
		return 0, 0, err
	}
	conv := func(re int16) int {
		r := 0
		if re&unix.POLLIN != 0 {
			r |= PollReady
		}
		if re&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			r |= PollError
		}
		return r
	}
	return conv(fds[0].Revents), conv(fds[1].Revents), nil
}

// YieldCPU offers the calling thread's CPU to the kernel's other runnable
// threads (sched_yield). A raw system call: it never blocks, it only lets
// another thread run first, and one the Go scheduler knew about would
// have its monitor hand the processor to another thread (a futex
// wake-up) whenever the yield let someone else run long.
func YieldCPU() {
	unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}
