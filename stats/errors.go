package stats

import "errors"

var (
	// ErrNotFound is matched by errors about a process that publishes no
	// statistics endpoint (not running sandirect, or nothing registered).
	ErrNotFound = errors.New("stats: no statistics endpoint")

	// ErrGone is returned by Reader.Snapshot once the process has exited
	// or stopped publishing.
	ErrGone = errors.New("stats: process no longer publishes")

	// ErrCorrupt is matched by errors about a table or endpoint that breaks
	// the layout: a bad header, count, length or byte.
	ErrCorrupt = errors.New("stats: corrupt statistics table")

	// ErrBusy is matched when no consistent copy could be taken: the
	// owner stayed in the middle of an update (it may have died there).
	ErrBusy = errors.New("stats: table kept changing")

	// ErrClosed is returned by a Reader's methods after its Close.
	ErrClosed = errors.New("stats: reader closed")
)
