package pin

import (
	"errors"

	"github.com/sandirect/sandirect/internal/feature"
)

// Errors returned by the package. A failure to pin for lack of memory or
// budget is not among them: it matches syscall.ENOBUFS (errors.Is), together
// with the errno mlock returned, if any.
var (
	// ErrNotSupported is matched by errors that report a missing kernel
	// feature (a monitor that cannot run); they name the feature.
	ErrNotSupported = feature.ErrNotSupported

	// ErrClosed is returned by a Register on a closed Cache.
	ErrClosed = errors.New("registration cache closed")

	// ErrEmpty is returned when the buffer to register is empty.
	ErrEmpty = errors.New("empty buffer")

	// ErrStack is returned when the buffer lies on a thread's stack, whose
	// pages are reused by the next call: it can never be registered.
	ErrStack = errors.New("buffer is on a stack")

	// ErrNotRegistered is returned by Deregister for a zero Handle or one
	// already deregistered as many times as it was registered.
	ErrNotRegistered = errors.New("handle not registered")

	// ErrNotOwned is returned by Free for memory that Alloc did not return.
	ErrNotOwned = errors.New("memory not allocated by pin.Alloc")

	// ErrInvalidConfig is matched by the errors of Config.Validate.
	ErrInvalidConfig = errors.New("invalid pin config")
)
