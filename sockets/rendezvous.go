package sockets

import (
	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/sys"
)

// What both sides of a split transfer share: the check that a buffer is in
// huge pages (the sender's offer, offerSplitLocked in send.go; the
// receiver's acceptance, acceptSplitLocked in recv.go).

// hugeBacked asks the kernel to back b with huge pages and reports
// whether they cover at least half of it (sys.CollapseHuge). Tests
// replace it to split transfers on any memory.
var hugeBacked = func(b []byte) bool {
	n, err := sys.CollapseHuge(b)
	return err == nil && 2*n >= len(b)
}

// hugeLocked reports whether b is in huge pages (hugeBacked), asking the
// kernel only when b is not inside *last, the last buffer found so: the
// first collapse of a buffer is slow, later answers are quick
// (docs/performance.md). It holds mu throughout; hugeUnlocked does not.
func (c *Conn) hugeLocked(last *span, b []byte) bool {
	if last.covers(b) {
		return true
	}
	ok := hugeBacked(b)
	if ok {
		*last = span{addr: mem.Addr(b), n: uintptr(len(b))}
	}
	return ok
}

// hugeUnlocked is hugeLocked for a caller that holds mu and lets it go
// while the kernel collapses b (a new buffer's first collapse takes
// milliseconds); *last is written under mu.
func (c *Conn) hugeUnlocked(last *span, b []byte) bool {
	if last.covers(b) {
		return true
	}
	c.mu.Unlock()
	ok := hugeBacked(b)
	c.mu.Lock()
	if ok {
		*last = span{addr: mem.Addr(b), n: uintptr(len(b))}
	}
	return ok
}
