package nic

import (
	"errors"
	"fmt"
	"os"

	"github.com/sandirect/sandirect/shm"
)

// Sends and receives in place (QPOptions.InPlace). The owner of such a
// queue pair — a connection of the sockets layer, which serializes each
// direction under its own lock — writes a send straight into the ring to
// the peer and reads an incoming send where it lies in the ring: one copy
// each way, no posted receive, no completion, and no lock of this layer,
// as UCX's single-thread mode and libfabric's FI_THREAD_DOMAIN let the
// caller promise to serialize. The peer sees ordinary sends.

var errInPlace = errors.New("nic: sends and receives of an in-place queue pair go through the rings (ReserveSend, RecvInPlace)")

// ErrRingFull is ReserveSend's answer when the ring to the peer has no
// room now: the peer has not released what it received (an owner that
// counts credits never sees it from an honest peer).
var ErrRingFull = errors.New("nic: no room in the ring to the peer")

// SetSpinning declares that this side waits for the peer's sends by
// spinning only (busy polling): the peer then publishes them without a
// fence each (shm.Consumer.SetSpinning; a wait that parks all the same
// takes it back). An error says why it cannot, and changes nothing.
func (qp *QueuePair) SetSpinning() error { return qp.in.SetSpinning() }

// ReserveSend returns n bytes in the ring to the peer for the next send;
// fill them and call CommitSend. It never waits. The caller serializes
// sends and does not use the queue pair after Close.
func (qp *QueuePair) ReserveSend(n int) ([]byte, error) {
	if qp.state.Load() != uint32(QPReady) {
		return nil, qp.stateErr()
	}
	buf, err := qp.out.Reserve(n, pastDeadline)
	if err != nil {
		if errors.Is(err, shm.ErrTooLarge) {
			return nil, fmt.Errorf("nic: send of %d bytes exceeds this connection's %d", n, qp.out.MaxPayload())
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, ErrRingFull
		}
		return nil, qp.failInPlace(err)
	}
	return buf, nil
}

// CommitSend sends the first n bytes of what ReserveSend returned, and
// wakes the peer if it sleeps.
func (qp *QueuePair) CommitSend(n int) error {
	if err := qp.out.Commit(tagSend, n); err != nil {
		return qp.failInPlace(err)
	}
	return nil
}

// AbandonSend gives back what ReserveSend returned, unsent: for an owner
// whose copy into it failed (its source faulted). The peer skips it.
func (qp *QueuePair) AbandonSend() {
	qp.out.Commit(tagNop, 0)
}

// testHookEmptyPoll, if set, runs when RecvInPlace found the ring empty,
// before it decides between nothing yet and the end.
var testHookEmptyPoll func()

// RecvInPlace returns the next incoming send: its bytes, in the ring and
// untrusted (the peer may still write them), valid until ReleaseRecv
// passes end, the ring position after it. ok is false when nothing has
// come. The caller serializes receives and does not use the queue pair
// after Close; a failure moves the queue pair to the error state.
func (qp *QueuePair) RecvInPlace() (data []byte, end uint64, ok bool, err error) {
	for {
		// The state is read before the ring: a peer that commits a send
		// and then hangs up has its send in the ring by the time the
		// hang-up is seen, so an empty ring after an error state read
		// first is the end. Read after the ring, the state could show a
		// hang-up whose last send came between the two: that send lost.
		failed := qp.state.Load() == uint32(QPError)
		rec, ok, err := qp.in.Poll()
		if !ok && err == nil && testHookEmptyPoll != nil {
			testHookEmptyPoll()
		}
		if !ok && err == nil && failed {
			// What the peer sent before it went is delivered first
			// (setError leaves an in-place ring open): then the end.
			return nil, 0, false, qp.stateErr()
		}
		if err != nil {
			if errors.Is(err, shm.ErrClosed) {
				err = ErrPeerGone
			}
			return nil, 0, false, qp.failInPlace(err)
		}
		if !ok {
			return nil, 0, false, nil
		}
		switch rec.Tag {
		case tagNop:
			continue // a send that failed at its source: skipped
		case tagSend:
			return rec.Data, qp.in.Position(), true, nil
		}
		return nil, 0, false, qp.failInPlace(fmt.Errorf("%w: record tag %d on the ring", ErrProtocol, rec.Tag))
	}
}

// RecvPending tells whether RecvInPlace has something to return: a
// record, or the ring's close or failure, or the queue pair's. The caller
// is the receiver.
func (qp *QueuePair) RecvPending() bool {
	return qp.in.Pending() || qp.state.Load() == uint32(QPError)
}

// ReleaseRecv gives the ring space of the incoming sends before position
// upTo back to the peer, and wakes it if it waits for room. upTo is an end
// RecvInPlace returned; positions only grow.
func (qp *QueuePair) ReleaseRecv(upTo uint64) { qp.in.ReleaseTo(upTo) }

// failInPlace moves the queue pair to the error state with reason (its
// flush runs here: the caller holds no lock of ours) and returns the
// error the owner sees.
func (qp *QueuePair) failInPlace(reason error) error {
	if qp.setError(reason) {
		qp.flush()
	}
	return qp.stateErr()
}
