//go:build !amd64

package mem

func prefetch(*byte, int) {}
