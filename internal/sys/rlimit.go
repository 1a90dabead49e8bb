//go:build linux

package sys

import "golang.org/x/sys/unix"

// NofileLimit returns the soft and hard RLIMIT_NOFILE.
func NofileLimit() (cur, max uint64, err error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, err
	}
	return r.Cur, r.Max, nil
}

// SetNofileLimit sets the soft RLIMIT_NOFILE (the hard one stays).
func SetNofileLimit(cur uint64) error {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return err
	}
	r.Cur = cur
	return unix.Setrlimit(unix.RLIMIT_NOFILE, &r)
}
