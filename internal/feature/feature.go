// Package feature runs probes for kernel features once and reports a missing
// feature as an error that matches ErrNotSupported and names the feature and
// the kernel that introduced it.
//
// A Test is safe for concurrent use; its probe runs at most once.
package feature

import (
	"errors"
	"sync"
)

// ErrNotSupported is matched (errors.Is) by every error that reports a
// missing kernel feature. Packages re-export it as their own ErrNotSupported.
var ErrNotSupported = errors.New("not supported")

// Error reports a feature that the running kernel or process lacks.
type Error struct {
	Name       string // the feature, e.g. "memfd_create"
	MinVersion string // first Linux version with it, e.g. "3.17"; may be empty
	Reason     error  // what the probe saw; may be nil
}

func (e *Error) Error() string {
	msg := e.Name + " not supported"
	if e.MinVersion != "" {
		msg += " (requires Linux " + e.MinVersion + ")"
	}
	if e.Reason != nil {
		msg += ": " + e.Reason.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrNotSupported) hold.
func (e *Error) Is(target error) bool { return target == ErrNotSupported }

// Unwrap returns what the probe saw.
func (e *Error) Unwrap() error { return e.Reason }

// Test is a lazily run, cached feature probe.
type Test struct {
	Name       string
	MinVersion string
	// Probe returns nil when the feature works, an error matching
	// ErrNotSupported (or any error, which is wrapped into one) when not.
	Probe func() error

	once   sync.Once
	result error
}

// Check runs the probe once and returns its cached verdict.
func (t *Test) Check() error {
	t.once.Do(func() {
		err := t.Probe()
		if err == nil {
			return
		}
		var fe *Error
		if errors.As(err, &fe) {
			t.result = err
			return
		}
		t.result = &Error{Name: t.Name, MinVersion: t.MinVersion, Reason: err}
	})
	return t.result
}

// Unsupported builds the error for a feature that is known to be missing.
func Unsupported(name, minVersion string, reason error) error {
	return &Error{Name: name, MinVersion: minVersion, Reason: reason}
}
