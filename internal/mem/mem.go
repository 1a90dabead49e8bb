// Package mem answers questions about where a byte slice lives: its
// address, and whether one slice lies inside another. It keeps unsafe out
// of the packages above shm.
package mem

import "github.com/sandirect/sandirect/internal/sys"

// Addr returns the address of b's first byte (0 for a nil or empty slice
// with no backing array). It is sys.Addr, for packages that need no other
// system call.
func Addr(b []byte) uintptr { return sys.Addr(b) }

// Within tells whether inner lies entirely inside outer.
func Within(inner, outer []byte) bool {
	s, os := Addr(inner), Addr(outer)
	return s >= os && s-os <= uintptr(len(outer)) && uintptr(len(inner)) <= uintptr(len(outer))-(s-os)
}

// Offset returns inner's offset inside outer; inner must be Within outer.
func Offset(inner, outer []byte) int { return int(Addr(inner) - Addr(outer)) }
