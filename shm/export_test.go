package shm

import (
	"fmt"
	"os"
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
