package shm

import (
	"fmt"
	"os"
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
