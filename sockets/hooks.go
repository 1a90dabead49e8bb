package sockets

import "sync/atomic"

// step names a point of the session protocol at which a test may stop a
// process (to kill it there: the peer-death tests of the reliability
// campaign).
type step string

const (
	stepNone            step = ""                  // no step: hook does nothing
	stepDataSent        step = "data-sent"         // a data message of a Write went out; more may follow
	stepDataTaken       step = "data-taken"        // a Read's fast path copied data messages out of the ring, not yet released
	stepRTSSent         step = "rts-sent"          // an rts went out; its source is registered
	stepBeforeWrite     step = "before-rdma-write" // write rendezvous: a cts is served next, no byte written yet
	stepBeforeWriteDone step = "before-write-done" // write rendezvous: the RDMA Write completed, its done not sent
	stepBeforeReadDone  step = "before-read-done"  // read rendezvous: every RDMA Read completed, the done not sent
	stepSplitCTSSent    step = "split-cts-sent"    // split transfer, receiver: the tail's cts queued, the head not read
	stepBeforeTail      step = "before-split-tail" // split transfer, sender: the tail's cts arrived, no byte written
	stepSinkReady       step = "sink-ready"        // receiver: the Read's own buffer is registered, nothing asked for or read
	stepSourceReady     step = "source-ready"      // a rendezvous source is registered, its rts not sent
)

// testHook is nil except in tests, which set it before any connection
// exists. It is called at each step with Conn.mu held: a fast path's
// half of it, or both.
var testHook func(step)

// testHookHandshake, if set, runs before each handshake of a listener
// (the tests of a dial its listener has not taken yet).
var testHookHandshake atomic.Pointer[func()]

// hook calls testHook, if set.
func hook(s step) {
	if testHook != nil && s != stepNone {
		testHook(s)
	}
}
