package mem

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func copyRep(dst, src *byte, n uintptr)

// repSupported: the CPU says its string moves are fast (ERMS).
var repSupported = cpu.X86.HasERMS

func copyRepBody(dst, src []byte) {
	copyRep(unsafe.SliceData(dst), unsafe.SliceData(src), uintptr(len(dst)))
}
