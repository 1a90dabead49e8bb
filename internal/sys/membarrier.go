//go:build linux

package sys

import (
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// membarrier(2) commands (linux/membarrier.h).
const (
	membarrierQuery                   = 0
	membarrierGlobalExpedited         = 1 << 1
	membarrierRegisterGlobalExpedited = 1 << 2
)

var membarrier struct {
	once  sync.Once
	done  chan struct{} // closed when the registration has answered
	state atomic.Int32
	err   error // set before done is closed
}

// MembarrierStart begins registering this process for global expedited
// memory barriers (MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, Linux 4.16)
// in the background, once: from then on, a MembarrierGlobal of any
// process makes every thread of this one that runs at that moment execute
// a full memory barrier. The registration waits for an RCU grace period
// in the kernel, which can take longer than a whole first dial should
// (docs/setup.md, "The memory-barrier registration off the path"), so
// nothing waits for it unless it must (MembarrierRegister).
// MembarrierState tells where it is.
func MembarrierStart() {
	membarrier.once.Do(func() {
		membarrier.done = make(chan struct{})
		go func() {
			err := membarrierRegister()
			membarrier.err = err
			if err == nil {
				membarrier.state.Store(MembarrierReady)
			} else {
				membarrier.state.Store(MembarrierFailed)
			}
			close(membarrier.done)
		}()
	})
}

// MembarrierState returns the registration's state now, without waiting:
// MembarrierPending, MembarrierReady or MembarrierFailed.
func MembarrierState() int32 { return membarrier.state.Load() }

// MembarrierRegister starts the registration if it has not started
// (MembarrierStart), waits for it, and returns its answer: nil when
// global barriers reach this process.
func MembarrierRegister() error {
	MembarrierStart()
	<-membarrier.done
	return membarrier.err
}

// membarrierRegister is the registration itself.
func membarrierRegister() error {
	got, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierQuery, 0, 0)
	switch {
	case errno != 0:
		return fmt.Errorf("membarrier query: %w", errno)
	case got&(membarrierGlobalExpedited|membarrierRegisterGlobalExpedited) != membarrierGlobalExpedited|membarrierRegisterGlobalExpedited:
		return fmt.Errorf("membarrier: no global expedited barriers (commands %#x)", got)
	}
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierRegisterGlobalExpedited, 0, 0); errno != 0 {
		return fmt.Errorf("membarrier register: %w", errno)
	}
	return nil
}

// MembarrierGlobal makes every running thread of every process registered
// with MembarrierRegister execute a full memory barrier before it returns
// (MEMBARRIER_CMD_GLOBAL_EXPEDITED): the slow side of an asymmetric
// fence, whose fast side needs none.
func MembarrierGlobal() error {
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierGlobalExpedited, 0, 0); errno != 0 {
		return fmt.Errorf("membarrier: %w", errno)
	}
	return nil
}
