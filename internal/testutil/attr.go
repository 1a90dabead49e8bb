package testutil

import (
	"os"
	"syscall"
	"testing"
)

// StartChildWith is StartChild with process attributes for the child, such
// as Cloneflags (syscall.CLONE_NEWPID to run it in a new pid namespace).
func StartChildWith(tb testing.TB, attr *syscall.SysProcAttr, name string, files []*os.File, args ...string) *Child {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatalf("os.Executable: %v", err)
	}
	return startChild(tb, exe, attr, name, files, args)
}
