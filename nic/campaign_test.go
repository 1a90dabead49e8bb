package nic

import "testing"

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
