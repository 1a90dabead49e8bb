package mem

import "unsafe"

//go:noescape
func copyNT(dst, src *byte, n uintptr)

const ntSupported = true

func copyNTBody(dst, src []byte) {
	copyNT(unsafe.SliceData(dst), unsafe.SliceData(src), uintptr(len(dst)))
}
