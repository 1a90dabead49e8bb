//go:build linux

package sys

import (
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// What the benchmark harness needs beyond the transport's own calls: typed
// views of words in a shared mapping (for spinning and futex floors measured
// without any ring code in between) and per-thread CPU affinity.

// Word64 returns a pointer to the 8-byte word at off in b, for use with
// sync/atomic. It fails unless the word lies inside b and is 8-byte aligned.
func Word64(b []byte, off int) (*uint64, error) {
	p, err := wordAt(b, off, 8)
	return (*uint64)(p), err
}

// Word32 returns a pointer to the 4-byte word at off in b, for use with
// sync/atomic and the futex calls. It fails unless the word lies inside b
// and is 4-byte aligned.
func Word32(b []byte, off int) (*uint32, error) {
	p, err := wordAt(b, off, 4)
	return (*uint32)(p), err
}

func wordAt(b []byte, off, size int) (unsafe.Pointer, error) {
	if off < 0 || off > len(b)-size {
		return nil, fmt.Errorf("word [%d, +%d) outside %d bytes", off, size, len(b))
	}
	p := unsafe.Pointer(unsafe.SliceData(b[off : off+size]))
	if uintptr(p)%uintptr(size) != 0 {
		return nil, fmt.Errorf("word at %#x not %d-byte aligned", uintptr(p), size)
	}
	return p, nil
}

// AllowedCPUs returns the CPUs the calling thread may run on, in ascending
// order.
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for cpu := 0; cpu < len(set)*64; cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	return cpus, nil
}

// PinThread restricts the calling OS thread to cpu and returns a function
// that restores the thread's previous affinity. The caller must hold the
// thread (runtime.LockOSThread) from before PinThread until after restore.
func PinThread(cpu int) (restore func() error, err error) {
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return nil, err
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return nil, err
	}
	return func() error { return unix.SchedSetaffinity(0, &old) }, nil
}

// ThreadPreemptions returns how often the calling thread has been switched
// out involuntarily (preempted) so far: a busy-polling measurement that
// counts any was disturbed by other work on its CPU.
func ThreadPreemptions() (int64, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, err
	}
	return ru.Nivcsw, nil
}

// ThreadCPU returns the CPU time (user and system) the calling thread has
// used so far: with the thread locked (runtime.LockOSThread), the work a
// goroutine did, whatever else runs on the machine.
func ThreadCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
