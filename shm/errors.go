package shm

import (
	"errors"

	"github.com/sandirect/sandirect/internal/feature"
)

var (
	// ErrCorrupt is matched by every error caused by an invalid value read
	// from shared memory: a bad header, position or record. The ring side
	// that saw it stays failed.
	ErrCorrupt = errors.New("shm: corrupt shared memory")

	// ErrClosed is returned by a producer whose consumer has closed, by a
	// consumer whose producer closed and that has drained every record, and
	// by a side after its own Close.
	ErrClosed = errors.New("shm: ring closed")

	// ErrTooLarge is returned for a record larger than the ring's MaxPayload.
	ErrTooLarge = errors.New("shm: record too large for ring")

	// ErrBadSegment is matched by errors about a received segment fd that
	// must not be mapped: unsealed, wrong size, not a memfd, bad header.
	ErrBadSegment = errors.New("shm: unusable segment")

	// ErrNotSupported is matched by errors about missing kernel features.
	ErrNotSupported = feature.ErrNotSupported
)
