package sockets

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/nic"
)

// io.Copy between a Conn and a file, a socket or a buffer: Conn is an
// io.WriterTo and an io.ReaderFrom, so that io.Copy skips its 32 KiB
// bounce buffer, as *net.TCPConn does with splice and sendfile.
//
//   - WriteTo hands received eager data to dst.Write where it lies in the
//     ring from the peer: one copy, dst's. No lock is held meanwhile (dst
//     may be this very connection, or block), so the message is lent:
//     its ring space is not given back, nor acknowledged, until dst.Write
//     returns (Conn.lending). Rendezvous data is read directly into a
//     buffer of writeToBuf bytes, which is larger than DirectRead, and
//     handed over from there: one copy by the nic, where io.Copy's 32 KiB
//     Reads would take it through the staging buffer, two.
//   - ReadFrom reads src into temporary device memory, which the peer
//     maps: up to EagerThreshold bytes go on as data messages, written
//     into the ring; more go as a rendezvous from that memory, which the
//     peer copies out — src's copy and the peer's, where a Write of a
//     bounce buffer copies it into temporary memory first. No lock is
//     held while src.Read runs, so that Close never waits for src.

// writeToBuf is the buffer WriteTo reads rendezvous data into: a copied
// piece (CopyChunk, 960 KiB by default) in one direct read.
const writeToBuf = 1 << 20

var writeToBufs = sync.Pool{New: func() any { b := make([]byte, writeToBuf); return &b }}

// WriteTo writes the stream to dst until EOF (io.WriterTo): what io.Copy
// calls. It returns the bytes written and the first error, nil at EOF.
// It reads as a series of Reads would (the read deadline applies, and
// concurrent Reads may take bytes between them); an error of dst is
// returned as it is, wrapped in a *net.OpError.
func (c *Conn) WriteTo(dst io.Writer) (int64, error) {
	c.lendMu.Lock()
	defer c.lendMu.Unlock()
	var total int64
	var buf *[]byte
	defer func() {
		if buf != nil {
			writeToBufs.Put(buf)
		}
	}()
	for {
		b, lent, err := c.lend()
		if !lent && err == nil {
			// No eager data at the head of the stream: a Read, which waits,
			// or takes a rendezvous straight into buf.
			if buf == nil {
				buf = writeToBufs.Get().(*[]byte)
			}
			var n int
			n, err = c.Read(*buf)
			b = (*buf)[:n]
			if err == io.EOF {
				return total, nil
			}
			if err != nil && n == 0 {
				return total, c.relabel(err, "writeto")
			}
		} else if err != nil {
			return total, c.opErr("writeto", err)
		}
		m, werr := dst.Write(b)
		if lent {
			c.endLend(m)
		}
		total += int64(m)
		switch {
		case werr != nil:
			return total, c.opErr("writeto", werr)
		case m != len(b):
			return total, c.opErr("writeto", io.ErrShortWrite)
		case err != nil:
			return total, c.relabel(err, "writeto")
		}
	}
}

// relabel gives err, a *net.OpError of Read, the operation op.
func (c *Conn) relabel(err error, op string) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return c.opErr(op, oe.Err)
	}
	return err
}

// lend returns the eager data at the head of the receive queue, lent out
// of the ring until endLend, waiting for something to come as a Read
// does; or lent false when the head is something else, which a Read
// takes. Its error is what a Read would return before delivering
// anything.
func (c *Conn) lend() (b []byte, lent bool, err error) {
	c.mu.Lock()
	c.rg.enterLocked(&c.mu)
	defer func() {
		c.rg.leaveLocked()
		c.mu.Unlock()
	}()
	for {
		switch {
		case c.closed:
			return nil, false, net.ErrClosed
		case c.err != nil && !c.errDrain:
			return nil, false, c.err
		case c.rdl.expired.Load():
			return nil, false, os.ErrDeadlineExceeded
		case c.rd.active || len(c.staged) > 0 || c.torn:
			return nil, false, nil
		case c.rxHead < len(c.rx):
			if c.rx[c.rxHead].kind != msgData {
				return nil, false, nil
			}
			return c.lendHeadLocked(), true, nil
		case c.err != nil || c.ringEnd:
			return nil, false, nil // nothing more can come: Read says why
		}
		if err := c.progressLocked(c.rounds, &c.rdl, true, false); err != nil {
			return nil, false, err
		}
	}
}

// lendHeadLocked takes the data message at the head of the receive
// queue, lent out of the ring if it lies there.
func (c *Conn) lendHeadLocked() []byte {
	// Everything consumed so far has its ring space given back (or moved
	// to the heap): that much may be acknowledged while the lend lasts.
	c.releaseLocked()
	e := &c.rx[c.rxHead]
	b := e.data
	if e.held {
		c.lending, c.lendStart, c.lendAck = true, e.start, c.ackBoundLocked()
	}
	c.consumeDataLocked(e.units)
	c.popRxLocked()
	return b
}

// endLend ends the lend of lend's data, of which dst took n bytes: its
// ring space goes back, and the acknowledgements held back go out.
func (c *Conn) endLend(n int) {
	c.mu.Lock()
	if c.lending {
		c.lending = false
		if c.lendWait != nil {
			close(c.lendWait)
			c.lendWait = nil
		}
	}
	if !c.torn {
		c.releaseLocked()
		c.pumpLocked()
		c.ensurePumpLocked()
	}
	if n > 0 {
		c.stats.count(cBytesRead, uint64(n)) // under mu, as Read's (stats)
	}
	c.mu.Unlock()
	traceIO(c, ioRead, n, nil) // tools/sdtrace: trace.go
}

// ReadFrom writes what it reads from src until EOF (io.ReaderFrom): what
// io.Copy calls. It returns the bytes written and the first error, nil
// at EOF; an error of src is returned as it is, wrapped in a
// *net.OpError. Writes of other goroutines may go between the chunks it
// reads from src, as between the Writes of a loop.
func (c *Conn) ReadFrom(src io.Reader) (int64, error) {
	n, err := c.readFrom(src)
	return n, c.opErr("readfrom", err)
}

// readFrom is ReadFrom without the error wrapping.
func (c *Conn) readFrom(src io.Reader) (int64, error) {
	var total int64
	var t []byte // temporary memory that src.Read fills
	defer func() {
		if t != nil {
			c.dev.putTemp(t)
			c.dev.release()
		}
	}()
	for {
		if t == nil {
			var err error
			if t, err = c.holdTemp(); err != nil {
				// No temporary memory: a bounce buffer and Write, which
				// takes the paths that need less (lowmem.go).
				n, err := io.CopyBuffer(writerOnly{c}, src, make([]byte, 32<<10))
				return total + n, err
			}
		}
		if err := c.writable(); err != nil {
			return total, err
		}
		k, rerr := src.Read(t[:c.readFromChunk(len(t))])
		if k > 0 {
			n, kept, err := c.writeTemp(t, k)
			total += int64(n)
			if kept {
				c.dev.release() // t belongs to the rendezvous now
				t = nil
			}
			if err != nil {
				return total, err
			}
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// writerOnly hides Conn.ReadFrom from io.CopyBuffer.
type writerOnly struct{ io.Writer }

// holdTemp takes a piece of temporary memory for ReadFrom, and a hold on
// the device, which it may outlive the connection in (src.Read runs with
// no lock held).
func (c *Conn) holdTemp() ([]byte, error) {
	if !c.dev.tryHold() {
		return nil, net.ErrClosed
	}
	t, err := c.dev.getTemp(c.cfg.CopyChunk)
	if err != nil {
		c.dev.release()
		return nil, err
	}
	return t, nil
}

// readFromChunk is how much of a piece of n bytes one src.Read may fill:
// a CopyChunk, inline part and all, that the peer takes in one transfer.
func (c *Conn) readFromChunk(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return min(n, c.cfg.CopyChunk, c.maxPayload+c.peerMaxXfer)
}

// writable tells why a write cannot go on now, or nil.
func (c *Conn) writable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.writableLocked(); err != nil {
		return err
	}
	if c.wdl.expired.Load() {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// writeTemp writes t[:k], which src.Read put into temporary memory, as
// one Write would: as data messages, or as a rendezvous whose source is t
// itself (kept: t now belongs to the connection).
func (c *Conn) writeTemp(t []byte, k int) (n int, kept bool, err error) {
	c.mu.Lock()
	c.wg.enterLocked(&c.mu)
	defer func() {
		c.ensurePumpLocked()
		c.wg.leaveLocked()
		c.mu.Unlock()
		traceIO(c, ioWrite, n, err) // tools/sdtrace: trace.go
	}()
	if err := c.writableLocked(); err != nil {
		return 0, false, err
	}
	if !c.eagerLocked(k) && !time.Now().Before(c.eagerUntil) {
		m, kept, err := c.sendTempLocked(t, k)
		if kept || err != nil {
			return m, kept, err
		}
	}
	for n < k {
		m, err := c.sendDataLocked(t[n:k])
		n += m
		if err != nil {
			return n, false, err
		}
	}
	return n, false, nil
}

// sendTempLocked sends t[:k] as an rts with the first maxPayload bytes
// inline and the rest by rendezvous from t, registered where it lies.
// When t cannot be registered whole it returns kept false and nothing
// sent: the caller sends data messages.
func (c *Conn) sendTempLocked(t []byte, k int) (int, bool, error) {
	inline := c.maxPayload
	size := k - inline
	read := c.peerRead
	c.pollNowLocked()
	for read && c.copyInFlight > 0 && c.copyInFlight+size > c.cfg.MaxCopyInFlight {
		if err := c.writableLocked(); err != nil {
			return 0, false, err
		}
		if c.wdl.expired.Load() {
			return 0, false, os.ErrDeadlineExceeded
		}
		if err := c.waitLocked(&c.wdl, true); err != nil {
			return 0, false, err
		}
	}
	if err := c.waitSendLocked(); err != nil {
		return 0, false, err
	}
	access := nic.Access(0)
	if read {
		access = nic.AccessRemoteRead
	}
	mr, n, err := c.dev.registerPrefix(nic.NoOwner, t[inline:k], access)
	if err != nil || n < size {
		if err == nil {
			c.dev.nic.Deregister(mr)
		}
		if err == nil || errors.Is(err, syscall.ENOBUFS) {
			c.stats.count(cFallbacks, 1)
			return 0, false, nil
		}
		return 0, false, err
	}
	c.stats.count(cRegisters, 1)
	x := &txfer{read: read, size: uint32(size), src: t[inline:k], temp: t, mr: mr, id: c.nextTx}
	c.nextTx++
	h := c.rtsHeaderLocked(x, read) // send.go; a copied source is never split
	if err := c.sendLocked(&h, t[:inline]); err != nil {
		c.dev.nic.Deregister(mr)
		c.nextTx--
		return 0, false, err
	}
	c.stats.count(cCopyChosen, 1)
	c.stats.count(cBytesCopied, uint64(size))
	c.stats.count(cBytesInline, uint64(inline))
	c.stats.count(cRendezvous, 1)
	if read {
		m, err := c.readRendezvousLocked(x, inline)
		return m, true, err
	}
	m, err := c.writeRendezvousLocked(x, inline)
	return m, true, err
}
