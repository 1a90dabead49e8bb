package sockets

import (
	"errors"
	"fmt"
	"syscall"
)

var (
	// ErrConfig is matched by errors about an invalid Config.
	ErrConfig = errors.New("sockets: invalid configuration")
	// ErrProtocol is matched by the error of a connection that this side
	// aborted because the peer broke the session protocol.
	ErrProtocol = errors.New("sockets: protocol violation")
	// ErrVersion is matched by errors about a peer that speaks no version
	// of the session protocol that we speak.
	ErrVersion = errors.New("sockets: no common protocol version")
	// ErrUnknownNetwork is returned for networks other than "sandirect",
	// "tcp", "tcp4" and "tcp6".
	ErrUnknownNetwork = errors.New("sockets: unknown network")
)

// resetError is the error of a connection that the peer reset: it aborted
// the connection, or it vanished without a graceful close. It matches
// syscall.ECONNRESET.
type resetError struct{ reason string }

func (e *resetError) Error() string {
	if e.reason == "" {
		return "connection reset by peer"
	}
	return "connection reset by peer: " + e.reason
}

func (e *resetError) Is(target error) bool { return target == syscall.ECONNRESET }

// abortError is the error of a connection this side aborted. It matches
// ErrProtocol when the peer broke the protocol.
type abortError struct {
	err error // ErrProtocol or another cause, wrapped with the reason
}

func (e *abortError) Error() string { return "connection aborted: " + e.err.Error() }
func (e *abortError) Unwrap() error { return e.err }

func protoErr(format string, args ...any) error {
	return &abortError{err: fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)}
}

// enobufs wraps err so that errors.Is(err, syscall.ENOBUFS) holds.
func enobufs(what string, err error) error {
	if errors.Is(err, syscall.ENOBUFS) {
		return fmt.Errorf("sockets: %s: %w", what, err)
	}
	return fmt.Errorf("sockets: %s: %w (%w)", what, syscall.ENOBUFS, err)
}

// descriptorErr is the error of an RDMA operation that the peer's
// registrations refused: a forged descriptor, or a source the peer
// revoked because it aborted (a zero-copy write past its deadline). The
// two look alike, so the error matches both ErrProtocol and
// syscall.ECONNRESET.
func descriptorErr(err error) error {
	return &abortError{err: fmt.Errorf("%w: %w: peer descriptor outside its registrations: %v", ErrProtocol, syscall.ECONNRESET, err)}
}

// faultError is the error of a Read or Write whose buffer faulted under a
// copy: the application unmapped it (or part of it) while the call used
// it. It matches syscall.EFAULT.
type faultError struct {
	what string  // "read" or "write"
	addr uintptr // the address that faulted
	base uintptr // the buffer's
	n    int     // its length
	err  error   // the runtime's error, or nil when a probe found it
}

func (e *faultError) Error() string {
	return fmt.Sprintf("sockets: the application's %s buffer faulted: %#x, %d bytes into its %d, is not mapped: %v",
		e.what, e.addr, int64(e.addr)-int64(e.base), e.n, syscall.EFAULT)
}

func (e *faultError) Is(target error) bool { return target == syscall.EFAULT }
func (e *faultError) Unwrap() error        { return e.err }
