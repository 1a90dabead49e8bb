package bpfmon

import (
	"errors"
	"os"

	"github.com/sandirect/sandirect/internal/feature"
)

var (
	// ErrNotSupported is matched by the error of Open when no attach method
	// works here; the error names what is missing.
	ErrNotSupported = feature.ErrNotSupported

	// ErrClosed is returned by every method of a closed Monitor.
	ErrClosed = os.ErrClosed

	// ErrCorrupt is returned by Drain and Sync when the ring buffer holds a
	// record that is not an event. It means a bug, not a lost event; Sync
	// treats it as a loss and flushes.
	ErrCorrupt = errors.New("bpfmon: malformed ring buffer record")
)
