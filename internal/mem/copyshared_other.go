//go:build !amd64

package mem

const repSupported = false

func copyRepBody(dst, src []byte) { copy(dst, src) }
