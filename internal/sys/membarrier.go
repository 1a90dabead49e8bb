//go:build linux

package sys

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// membarrier(2) commands (linux/membarrier.h).
const (
	membarrierQuery                   = 0
	membarrierGlobalExpedited         = 1 << 1
	membarrierRegisterGlobalExpedited = 1 << 2
)

var membarrierOnce struct {
	sync.Once
	err error
}

// MembarrierRegister registers this process for global expedited memory
// barriers (MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, Linux 4.16): from
// then on, a MembarrierGlobal of any process makes every thread of this
// one that runs at that moment execute a full memory barrier. Only the
// first call does the work; later ones return its answer.
func MembarrierRegister() error {
	membarrierOnce.Do(func() {
		got, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierQuery, 0, 0)
		switch {
		case errno != 0:
			membarrierOnce.err = fmt.Errorf("membarrier query: %w", errno)
			return
		case got&(membarrierGlobalExpedited|membarrierRegisterGlobalExpedited) != membarrierGlobalExpedited|membarrierRegisterGlobalExpedited:
			membarrierOnce.err = fmt.Errorf("membarrier: no global expedited barriers (commands %#x)", got)
			return
		}
		if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierRegisterGlobalExpedited, 0, 0); errno != 0 {
			membarrierOnce.err = fmt.Errorf("membarrier register: %w", errno)
		}
	})
	return membarrierOnce.err
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
