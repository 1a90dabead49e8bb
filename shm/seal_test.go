package shm

import (
	"errors"
	"syscall"
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
)

// Only the creator's own mapping writes a read-only segment: whoever holds
// the fd can map it for reading, not for writing. A plain segment is not
// sealed against writes.
func TestReadOnlySegment(t *testing.T) {
	plain := newSegment(t, 2*sys.PageSize)
	if plain.WritesSealed() {
		t.Fatal("a plain segment is sealed against writes")
	}
	s, err := CreateReadOnlySegment("sealed", KindRings, 2*sys.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.WritesSealed() {
		t.Fatal("a read-only segment is not sealed against writes")
	}
	s.Bytes()[s.Size()-1] = 7 // the creator's mapping stays writable
	if m, err := sys.MapShared(s.Fd(), s.Size(), false); err == nil {
		sys.Munmap(m)
		t.Fatal("a new writable mapping was allowed")
	} else if !errors.Is(err, syscall.EPERM) {
		t.Fatalf("writable mapping: %v, want EPERM", err)
	}
	r, err := OpenSegmentReadOnly(dupFd(t, s.Fd()), KindRings, SegmentHeaderSize)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := r.Bytes()[s.Size()-1]; got != 7 {
		t.Fatalf("reader sees %d, want 7", got)
	}
}
