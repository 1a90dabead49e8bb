package sockets

// Eager or rendezvous. A write of at most one message's payload always
// goes as a data message, written into the ring to the peer. A larger one
// of at most Config.EagerThreshold bytes goes as data messages too — the
// writer copies each into the ring while the reader copies the one before
// out, one pipelined copy in all (docs/protocol.md, "Eager") — but only if
// the credits it holds now carry all of it. Otherwise it goes by
// rendezvous from temporary memory, which returns as soon as it is
// copied: an eager write that had to wait for credits mid-way would wait
// for the peer to read, and two sides that both write before they read
// (an echo of a write larger than the rings) would wait for each other
// for ever, where the copy in temporary memory lets the write return.

// eagerLocked tells whether a write of n bytes goes as data messages.
func (c *Conn) eagerLocked(n int) bool {
	switch {
	case n <= c.maxPayload:
		return true
	case n > c.cfg.EagerThreshold:
		return false
	case c.fitsLocked(n):
		return true
	}
	// Credits may have come back since the last poll.
	c.pollNowLocked()
	return c.fitsLocked(n)
}

// fitsLocked tells whether the credits we hold carry n bytes of data
// messages now, with the credits data leaves to control messages. A
// message counts a credit per maxPayload bytes it carries (unitsOf), so n
// bytes need as many credits however they are cut.
func (c *Conn) fitsLocked(n int) bool {
	units := (n + c.maxPayload - 1) / c.maxPayload
	return len(c.ctlq) == 0 && c.canSendLocked(classData) && int(c.creditsLocked())-int(classData)+1 >= units
}
