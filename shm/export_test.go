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
	h.mu.Lock()
	defer h.mu.Unlock()
	lead := -1
	if h.leader != nil {
		lead = int(h.leader.slot)
	}
	var fs []uint32
	for _, f := range h.followers {
		fs = append(fs, f.slot)
	}
	return fmt.Sprintf("leader %d followers %v bell %d pending %v", lead, fs, load32(h.bell), h.pending())
}

func (w *Waiter) debugState() string {
	return fmt.Sprintf("slot %d sleeping %d leading %v tokens %d", w.slot, w.sleeping.Load(), w.leading.Load(), len(w.ch))
}

// pipeBytes is what the hub's pipe holds (FIONREAD).
func (h *Hub) pipeBytes() int {
	var n int32
	syscall.Syscall(syscall.SYS_IOCTL, uintptr(h.rfd), syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	return int(n)
}
