package testutil

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// StartChildAs is StartChild with the child running under the credentials
// cred (for instance uid and gid 65534, to test as an unprivileged user; the
// parent must be root). The test binary usually lives in a directory only its
// owner may enter, so it is copied to a world-readable temporary directory,
// removed when the test ends.
func StartChildAs(tb testing.TB, cred *syscall.Credential, name string, files []*os.File, args ...string) *Child {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatalf("os.Executable: %v", err)
	}
	dir, err := os.MkdirTemp("", "sandirect-child-")
	if err != nil {
		tb.Fatalf("temp dir for child binary: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatalf("chmod %s: %v", dir, err)
	}
	copyExe := filepath.Join(dir, filepath.Base(exe))
	if err := copyFile(copyExe, exe); err != nil {
		tb.Fatalf("copy test binary: %v", err)
	}
	return startChild(tb, copyExe, &syscall.SysProcAttr{Credential: cred}, name, files, args)
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
