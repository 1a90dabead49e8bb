package nic

import (
	"errors"
	"fmt"

	"github.com/sandirect/sandirect/internal/feature"
)

var (
	// ErrClosed is returned by operations on a closed device, queue pair,
	// completion queue or listener.
	ErrClosed = errors.New("nic: closed")
	// ErrQPState is returned when posting to a queue pair in the error state.
	ErrQPState = errors.New("nic: queue pair in error state")
	// ErrQueueFull is returned when a post exceeds the queue's depth.
	ErrQueueFull = errors.New("nic: work queue full")
	// ErrBadKey is matched by errors about an lkey that names no
	// registration covering the buffer, or a buffer outside its region.
	ErrBadKey = errors.New("nic: bad local key or buffer")
	// ErrRefused is matched by errors about a connection the peer or our
	// policy refused.
	ErrRefused = errors.New("nic: connection refused")
	// ErrProtocol is matched by errors about a peer that broke the
	// connection-manager protocol.
	ErrProtocol = errors.New("nic: protocol violation")
	// ErrPeerGone is the reason a queue pair fails when its peer died or
	// hung up.
	ErrPeerGone = errors.New("nic: peer gone")
	// ErrNotSupported is matched by errors about missing features.
	ErrNotSupported = feature.ErrNotSupported
)

// Status is a completion's outcome.
type Status uint8

const (
	StatusSuccess          Status = iota
	StatusLocalLength             // a receive buffer was too small
	StatusLocalProtection         // a local buffer failed its lkey check
	StatusLocalAccess             // a local buffer faulted during a copy
	StatusRemoteAccess            // rkey, bounds, access or revocation check failed at the target
	StatusRemoteOp                // the target's memory could not be accessed (vanished, faulted)
	StatusRNRRetryExceeded        // the receiver consumed nothing for too long
	StatusFlushed                 // the queue pair entered the error state before this ran
	StatusFatal                   // an internal error
)

var statusNames = [...]string{
	StatusSuccess:          "success",
	StatusLocalLength:      "local length error",
	StatusLocalProtection:  "local protection error",
	StatusLocalAccess:      "local access error",
	StatusRemoteAccess:     "remote access error",
	StatusRemoteOp:         "remote operation error",
	StatusRNRRetryExceeded: "RNR retry exceeded",
	StatusFlushed:          "work request flushed",
	StatusFatal:            "fatal error",
}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// CompletionError is the error form of a failed completion.
type CompletionError struct {
	Status Status
	Op     Opcode
	ID     uint64
	Reason error // may be nil
}

func (e *CompletionError) Error() string {
	msg := fmt.Sprintf("nic: %v wr %d: %v", e.Op, e.ID, e.Status)
	if e.Reason != nil {
		msg += ": " + e.Reason.Error()
	}
	return msg
}

func (e *CompletionError) Unwrap() error { return e.Reason }
