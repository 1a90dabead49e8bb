//go:build linux

package sys

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A thread's scheduling priority: the eBPF monitor's background load
// runs at a lower one (pin), so that a first connection does not wait
// behind it.

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
