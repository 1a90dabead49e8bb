package sockets

import (
	"errors"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"syscall"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/nic"
)

// Application memory can vanish under a copy: a buffer from mmap that the
// application unmaps while a Read or Write uses it. Copies of it run with
// runtime/debug.SetPanicOnFault, so that the fault becomes a panic that
// is recovered here into a faultError instead of killing the process.
// Only a fault inside the application's buffer is recovered; any other
// panic goes on.
//
// Three kinds of copy, three kinds of protection:
//   - Copies under Conn.mu (a small message into a send buffer, received
//     bytes out to the Read's buffer) run inside one protected region per
//     Read or Write, set up by the deferred function that already ends
//     the call (endRead, endWrite): no cost per copy. The session state
//     is updated only after each such copy, so a fault leaves it as it
//     was; Conn.readN and Conn.writeN tell how many bytes the call had
//     delivered or accepted before it.
//   - Copies with Conn.mu released (the pieces of copied writes) and the
//     inline part of an rts (its source is registered by then) use
//     copyGuarded, a region of their own.
//   - Copies that the nic makes (RDMA Reads into a Read's buffer, RDMA
//     Writes from a source, the peer's reads of a zero-copy source) are
//     protected there and fail the queue pair. The side whose work failed
//     then probes its own buffer (blameLocked): if it faults, the
//     connection's error is that fault, not the peer's reset.

// endRead ends a Read (deferred by read): it turns a fault in b into the
// call's error, then sends what the Read made due and unlocks mu.
func (c *Conn) endRead(b []byte, old bool, n *int, err *error) {
	debug.SetPanicOnFault(old)
	if r := recover(); r != nil {
		c.abandonFastLocked() // fastread.go
		ferr := faultIn(r, b, "read")
		if ferr == nil {
			c.rg.leaveLocked()
			c.unlockHeld()
			panic(r)
		}
		if !c.recvOnly {
			c.abandonSendLocked()
		}
		*n, *err = c.readN, ferr
	}
	if *n > 0 {
		// Under the receive half: WriteTo's lends count it too (stats:
		// one writer).
		c.stats.count(cBytesRead, uint64(*n))
	}
	if !c.recvOnly {
		// A fast Read queued nothing: what it had to send it sent under
		// both halves (pumpReadLocked).
		c.ensurePumpLocked()
	}
	c.rg.leaveLocked()
	c.unlockHeld()
}

// endWrite is endRead for a Write from b.
func (c *Conn) endWrite(b []byte, old bool, n *int, err *error) {
	debug.SetPanicOnFault(old)
	if r := recover(); r != nil {
		ferr := faultIn(r, b, "write")
		if ferr == nil {
			c.unlockWrite()
			panic(r)
		}
		c.abandonSendLocked()
		*n, *err = c.writeN, ferr
	}
	if !c.sendOnly {
		c.ensurePumpLocked() // a fast Write queues nothing
	}
	c.unlockWrite()
}

// unlockWrite releases what a Write holds: the send half of Conn.mu
// (sendOnly), or the write gate and both halves.
func (c *Conn) unlockWrite() {
	if c.sendOnly {
		c.sendOnly = false
		c.mu.send.Unlock()
		return
	}
	c.wg.leaveLocked()
	c.mu.Unlock()
}

// copyGuarded copies src into dst, memory the peer reads next: through
// the caches (mem.CopyShared), or around them with nt (mem.CopyNT). It
// returns a faultError if app — the application's side of the copy, src
// or dst — faults.
func copyGuarded(dst, src, app []byte, what string, nt bool) (n int, err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if err = faultIn(r, app, what); err == nil {
				panic(r)
			}
			n = 0
		}
	}()
	if nt {
		return mem.CopyNT(dst, src), nil
	}
	return mem.CopyShared(dst, src), nil
}

// sendGuardedLocked is sendLocked for a payload of application memory
// with no protected region around it (see above).
func (c *Conn) sendGuardedLocked(h *header, payload []byte, what string) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if err = faultIn(r, payload, what); err == nil {
				panic(r)
			}
			c.abandonSendLocked()
		}
	}()
	return c.sendLocked(h, payload)
}

// abandonSendLocked gives back the ring reservation of a send whose
// payload copy faulted: the next send must find the ring as it was.
func (c *Conn) abandonSendLocked() {
	if c.reserved {
		c.reserved = false
		c.qp.AbandonSend()
	}
}

// faultIn returns the error for r, a recovered panic, if it is a memory
// fault inside the pages of app; otherwise nil.
func faultIn(r any, app []byte, what string) error {
	re, ok := r.(runtime.Error)
	if !ok {
		return nil
	}
	fa, ok := r.(interface{ Addr() uintptr })
	if !ok {
		return nil // a nil dereference: a bug, not the application's memory
	}
	addr := fa.Addr()
	page := uintptr(sys.PageSize)
	lo := mem.Addr(app) &^ (page - 1)
	hi := (mem.Addr(app) + uintptr(len(app)) + page - 1) &^ (page - 1)
	if len(app) == 0 || addr < lo || addr >= hi {
		return nil
	}
	return &faultError{what: what, addr: addr, base: mem.Addr(app), n: len(app), err: re}
}

// probeSink keeps probe's loads from being optimized away.
var probeSink atomic.Uint32

// probe touches every page of app and returns a faultError if one of
// them cannot be read: whether the application's buffer is to blame for
// a failed RDMA operation on it.
func probe(app []byte, what string) (err error) {
	if len(app) == 0 {
		return nil
	}
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if err = faultIn(r, app, what); err == nil {
				panic(r)
			}
		}
	}()
	// A byte a page apart touches every page the buffer spans, the last
	// one by its last byte.
	var s byte
	for i := 0; i < len(app); i += sys.PageSize {
		s ^= app[i]
	}
	s ^= app[len(app)-1]
	probeSink.Store(uint32(s))
	return nil
}

// blameLocked is called when an operation on the application's buffer
// app failed with err, which names the connection's failure: if app
// faults, the fault is the cause, and it becomes the connection's error
// (the queue pair failed with it, so the connection is lost) and the
// call's. Deadlines, Close and faults found already pass unchanged.
func (c *Conn) blameLocked(app []byte, what string, err error) error {
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.EFAULT) {
		return err
	}
	ferr := probe(app, what)
	if ferr == nil {
		return err
	}
	ae := &abortError{err: ferr}
	if c.err == nil {
		c.abortLocked(ae)
	} else {
		c.err, c.errDrain = ae, false // instead of the reset the queue pair's failure recorded
		c.wakeLocked()
	}
	return ferr
}

// goneReason is the reason of the reset recorded when the queue pair
// failed with err: what failed, when it was one of our own RDMA
// operations on the peer's memory.
func goneReason(err error) string {
	var ce *nic.CompletionError
	if errors.As(err, &ce) && ce.Status == nic.StatusRemoteOp && ce.Reason != nil {
		return "RDMA " + ce.Op.String() + " on the peer's memory failed: " + ce.Reason.Error()
	}
	if errors.Is(err, nic.ErrRefused) || errors.Is(err, nic.ErrProtocol) {
		return err.Error() // an early dial's listener answered otherwise (nic.QPOptions.Early)
	}
	return "peer gone"
}

// blameSourceLocked is blameLocked for the source of x, a rendezvous we
// send, when it is the application's buffer (zero copy).
func (c *Conn) blameSourceLocked(x *txfer, err error) error {
	if x.temp != nil {
		return err
	}
	return c.blameLocked(x.src, "write", err)
}

// sinkLocked is the part of dst, the rest of a Read's buffer, that the
// receive in progress writes directly, or nil.
func (c *Conn) sinkLocked(dst []byte) []byte {
	if !c.rd.active || !c.rd.direct {
		return nil
	}
	return dst[:c.rd.n]
}
