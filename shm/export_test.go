package shm

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

func uintptrOf(p *byte) uintptr { return uintptr(unsafe.Pointer(p)) }

var ErrDeadlineExceededAlias = os.ErrDeadlineExceeded

func (h *Hub) debugState() string {
	return fmt.Sprintf("bell %d pending %v", load32(h.bell), h.pending())
}

func (w *Waiter) debugState() string {
	return fmt.Sprintf("slot %d sleeping %d tokens %d", w.slot, w.sleeping.Load(), len(w.ch))
}

// pipeBytes is what the hub's pipe holds (FIONREAD).
func (h *Hub) pipeBytes() int {
	var n int32
	syscall.Syscall(syscall.SYS_IOCTL, uintptr(h.rfd), syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	return int(n)
}
