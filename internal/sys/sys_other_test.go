//go:build !linux

package sys

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandirect/sandirect/internal/feature"
)

// TestNotLinux: off Linux, every call that would be a system call fails
// with an error that matches feature.ErrNotSupported and names the call.
func TestNotLinux(t *testing.T) {
	for _, tc := range []struct {
		call string
		err  error
	}{
		{"memfd_create", func() error { _, err := MemfdCreate("x"); return err }()},
		{"mmap", func() error { _, err := MapAnon(4096); return err }()},
		{"mlock", Mlock(0, 4096)},
		{"futex", FutexWait(new(uint32), 0, 0)},
		{"process_vm_readv", func() error { _, err := ProcessVMReadv(1, nil, 0); return err }()},
		{"userfaultfd", func() error { _, err := Userfaultfd(0); return err }()},
	} {
		if !errors.Is(tc.err, feature.ErrNotSupported) || !strings.Contains(tc.err.Error(), tc.call) {
			t.Errorf("%s: %v, want an error matching ErrNotSupported that names it", tc.call, tc.err)
		}
	}
	if b := []byte{1, 2}; Bytes(Addr(b), 2)[1] != 2 {
		t.Error("Addr and Bytes do not round-trip")
	}
}
