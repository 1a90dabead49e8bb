package nic

import (
	"runtime"
	"testing"
	"time"
)

// TestRecvInPlaceSendBeforeHangUp: a send the peer commits just before it
// hangs up is delivered before the end, even when it lands, and the
// hang-up is seen, between RecvInPlace's look at the empty ring and its
// decision. Deciding on the state read after the ring lost that send (a
// listener's echo before its close, unseen by the dialer now and then:
// the sockets churn campaign's "peer gone").
func TestRecvInPlaceSendBeforeHangUp(t *testing.T) {
	a, b := pairWith(t, nil, nil, func(o *QPOptions) { o.InPlace = true })
	hung := false
	testHookEmptyPoll = func() {
		testHookEmptyPoll = nil
		buf, err := a.qp.ReserveSend(5)
		if err != nil {
			t.Fatal(err)
		}
		copy(buf, "hello")
		if err := a.qp.CommitSend(5); err != nil {
			t.Fatal(err)
		}
		a.qp.Close()
		deadline := time.Now().Add(10 * time.Second)
		for b.qp.State() != QPError {
			if time.Now().After(deadline) {
				t.Error("the peer's hang-up not seen after 10 s")
				return
			}
			runtime.Gosched()
		}
		hung = true
	}
	defer func() { testHookEmptyPoll = nil }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, end, ok, err := b.qp.RecvInPlace()
		if err != nil {
			t.Fatalf("RecvInPlace ended (%v) before the send the peer made before it hung up (hang-up seen: %v)", err, hung)
		}
		if ok {
			if string(data) != "hello" {
				t.Fatalf("received %q, want %q", data, "hello")
			}
			b.qp.ReleaseRecv(end)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing received after 10 s")
		}
		runtime.Gosched()
	}
	if !hung {
		t.Fatal("the hook did not run: the test tested nothing")
	}
	if _, _, ok, err := b.qp.RecvInPlace(); ok || err == nil {
		t.Fatalf("after the last send: ok %v, err %v; want the end", ok, err)
	}
}
