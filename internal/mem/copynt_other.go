//go:build !amd64

package mem

const ntSupported = false

func copyNTBody(dst, src []byte) { copy(dst, src) }
