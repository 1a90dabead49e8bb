package nic

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// TestDeregisterAfterClose: a region deregistered after its device closed
// (a connection torn down after its last sibling closed the device) is
// released without touching the unmapped registration table: no panic,
// and its pages are unlocked.
func TestDeregisterAfterClose(t *testing.T) {
	for _, access := range []Access{AccessLocalWrite, AccessRemoteRead, AccessLocalWrite | AccessRemoteWrite} {
		d, err := Open(nil)
		if err != nil {
			t.Fatal(err)
		}
		before := vmLocked(t)
		buf := make([]byte, 64<<10)
		mr := register(t, d, buf, access)
		d.Close()
		if err := d.Deregister(mr); err != nil {
			t.Fatalf("access %v: Deregister after Close: %v", access, err)
		}
		if after := vmLocked(t); after > before {
			t.Fatalf("access %v: locked memory %d kB before, %d kB after", access, before, after)
		}
	}
}

// TestPeerTableReadOnly: the registration table of a peer (a real child
// process) is mapped read-only here: a write to it faults, so not even a
// bug of ours can change which keys the peer honours.
func TestPeerTableReadOnly(t *testing.T) {
	e, _, _, _ := dialTarget(t, "segment", 4096, true)
	mem := e.qp.peer.table.mem
	if len(mem) == 0 {
		t.Fatal("no peer table mapped")
	}
	before := mem[len(mem)-1]
	faulted := func() (fault bool) {
		old := debug.SetPanicOnFault(true)
		defer func() {
			debug.SetPanicOnFault(old)
			if r := recover(); r != nil {
				if _, ok := r.(runtime.Error); !ok {
					panic(r)
				}
				t.Logf("write to the peer's table: %v", r)
				fault = true
			}
		}()
		mem[len(mem)-1] = before + 1
		return false
	}()
	if !faulted || mem[len(mem)-1] != before {
		t.Fatal("wrote into the peer's registration table")
	}
}
