//go:build linux

package sys

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FutexWaiter is one entry of FutexWaitv: struct futex_waitv.
type FutexWaiter struct {
	Val      uint64
	Addr     uint64
	Flags    uint32
	reserved uint32
}

// FutexWaitvMax is the kernel's limit on the number of words one
// futex_waitv call waits on.
const FutexWaitvMax = 128

const (
	futex2SizeU32 = 0x02
	futex2Private = 128 // FUTEX2_PRIVATE, the value of FUTEX_PRIVATE_FLAG
)

// SetWord makes w wait on the shared 32-bit word at addr while it reads val.
func (w *FutexWaiter) SetWord(addr *uint32, val uint32) {
	w.Val = uint64(val)
	w.Addr = uint64(uintptr(unsafe.Pointer(addr)))
	w.Flags = futex2SizeU32
}

// SetPrivateWord is SetWord for a word only this process's threads use
// (FUTEX2_PRIVATE: keyed by address, no page lookup on every wait). Wake
// it with FutexWakePrivate.
func (w *FutexWaiter) SetPrivateWord(addr *uint32, val uint32) {
	w.SetWord(addr, val)
	w.Flags |= futex2Private
}

// FutexWaitv sleeps until one of the words is woken (FUTEX_WAKE on it), or
// one of them does not hold its value at the start (EAGAIN), or the
// timeout (relative; negative: none) passes (ETIMEDOUT). It returns the
// index of the woken word. Linux 5.16.
func FutexWaitv(ws []FutexWaiter, timeout time.Duration) (int, error) {
	if len(ws) == 0 {
		return -1, unix.EINVAL
	}
	var tsp unsafe.Pointer
	var ts unix.Timespec
	if timeout >= 0 {
		// futex_waitv takes an absolute time on the given clock.
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			return -1, err
		}
		ts = unix.NsecToTimespec(ts.Nano() + int64(timeout))
		tsp = unsafe.Pointer(&ts)
	}
	r, _, e := unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&ws[0])), uintptr(len(ws)), 0, uintptr(tsp), unix.CLOCK_MONOTONIC, 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}
