package shm

import (
	"os"
	"unsafe"
)

func uintptrOf(p *byte) uintptr { return uintptr(unsafe.Pointer(p)) }

var ErrDeadlineExceededAlias = os.ErrDeadlineExceeded
