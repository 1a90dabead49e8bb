//go:build linux

package sys

import (
	"fmt"
	"os"
	"strconv"
	"strings"
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

// NiceThread lowers the calling OS thread's scheduling priority to nice
// (Linux keeps a nice value per thread) and returns a function that puts
// the old one back; restore names the thread by its id, so any goroutine
// may call it while the thread is held. The caller must hold the thread
// (runtime.LockOSThread) from before NiceThread until after restore: a
// thread released at the lower priority serves other goroutines slowly.
// It should not end the thread instead (a locked goroutine's exit), which
// delivers the parent-death signal to every child the program started
// from that thread (Pdeathsig).
// NiceThread fails, changing nothing, when the thread could not raise its
// priority back: without CAP_SYS_NICE, RLIMIT_NICE must allow the old value.
func NiceThread(nice int) (restore func() error, err error) {
	tid := unix.Gettid()
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return nil, fmt.Errorf("getpriority: %w", err)
	}
	old := 20 - prio // the system call's value is 20 - nice, to stay positive
	if nice <= old {
		return nil, fmt.Errorf("nice %d is not below the thread's priority (nice %d)", nice, old)
	}
	if !canRenice(old) {
		return nil, fmt.Errorf("nice %d could not be restored: no CAP_SYS_NICE, and RLIMIT_NICE does not allow it", old)
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil {
		return nil, fmt.Errorf("setpriority: %w", err)
	}
	return func() error {
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, old); err != nil {
			return fmt.Errorf("setpriority back to %d: %w", old, err)
		}
		return nil
	}, nil
}

// ThreadNice returns the nice value of thread tid of this process (the
// 19th field of its /proc stat file).
func ThreadNice(tid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold anything
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("thread %d: stat without a command name", tid)
	}
	fields := strings.Fields(s[i+2:]) // from the 3rd field on
	if len(fields) < 19-2 {
		return 0, fmt.Errorf("thread %d: stat of %d fields", tid, len(fields)+2)
	}
	return strconv.Atoi(fields[19-3])
}

// canRenice tells whether the calling thread may set its nice value to
// nice from a higher one.
func canRenice(nice int) bool {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NICE, &lim) == nil && 20-int64(lim.Cur) <= int64(nice) {
		return true
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return false
	}
	return data[unix.CAP_SYS_NICE/32].Effective&(1<<(unix.CAP_SYS_NICE%32)) != 0
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
