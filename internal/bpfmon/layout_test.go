//go:build 386 || amd64

package bpfmon

import (
	"testing"
	"unsafe"
)

// TestStateLayout checks the Go offsets of the state words against struct
// state as bpf2go read it from the object's BTF.
func TestStateLayout(t *testing.T) {
	var s bpfmonState
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"epoch", unsafe.Offsetof(s.Epoch), stateEpoch},
		{"overflow", unsafe.Offsetof(s.Overflow), stateOverflow},
		{"lost_epoch", unsafe.Offsetof(s.LostEpoch), stateLostEpoch},
		{"watch_all", unsafe.Offsetof(s.WatchAll), stateWatchAll},
		{"waiters", unsafe.Offsetof(s.Waiters), stateWaiters},
		{"size", unsafe.Sizeof(s), stateSize},
	} {
		if c.got != c.want {
			t.Errorf("state %s at %d, Go says %d", c.name, c.got, c.want)
		}
	}
	if eventSize != 40 || offPad+4 != eventSize {
		t.Errorf("event size %d", eventSize)
	}
}
