package sockets

import (
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/quiesce"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// Conn is a connection over shared memory: a nic queue pair driven by the
// session protocol (docs/protocol.md). It implements net.Conn and is safe
// for concurrent use: Reads are serialized among themselves, so are
// Writes, and Read, Write, Close, CloseWrite and the deadline setters may
// be called from any goroutine at any time.
type Conn struct {
	cfg          Config
	dev          *device
	qp           *nic.QueuePair
	cq           *nic.CompletionQueue
	netw         string
	laddr, raddr net.Addr
	stats        stats
	owner        nic.Owner // the connection's cached registrations: flushed at teardown

	// Lock order: rmu, then wmu, then mu, then the device's and the
	// nic's locks. rmu is held by Read for its whole call, wmu by Write
	// and CloseWrite.
	rmu, wmu sync.Mutex
	rdl, wdl deadline
	closing  chan struct{} // closed by Close
	kick     atomic.Uint32 // bumped when a waiting poller must look up
	tornDown chan struct{} // closed when teardown has released everything
	tearOnce sync.Once

	// lendMu serializes WriteTo calls: one lends received data at a time
	// (copy.go). Lock order: lendMu, then rmu.
	lendMu sync.Mutex

	// Bytes the Read (Write) in progress has delivered (accepted) so far,
	// for the error of a fault in its buffer (fault.go); guarded by rmu
	// (wmu).
	readN, writeN int

	mu sync.Mutex // guards everything below
	session
}

// session is the protocol state of a connection, guarded by Conn.mu.
type session struct {
	// Progress: one goroutine at a time polls the completion queue (the
	// poller); the others wait for changed to be closed.
	polling  bool
	sleeping bool // the poller waits in CompletionQueue.Wait
	pumping  bool // a goroutine drives the connection for ctlq
	// The incoming ring (nic.QPOptions.InPlace): messages are read where
	// they lie. inPos is the ring position after the last one taken,
	// relPos how far the ring is given back; a message the application has
	// not read holds its space (rxEntry.held), and so do the messages
	// after it.
	inPos, relPos uint64
	reserved      bool          // sendLocked holds a reservation in the ring to the peer
	taken         uint64        // messages taken from the ring
	heldN         int           // rx entries that hold ring space
	interesting   bool          // a dispatch round saw more than send completions
	wantSend      bool          // a writer waits for a free send buffer
	changed       chan struct{} // closed after each round of dispatch; nil if nobody waits
	rounds        uint32        // rounds of dispatch ended, and wake-ups: see progress
	comps         [16]nic.Completion

	// Messages travel in the queue pair's rings, written and read in
	// place; bufSize is the largest message this side takes. The peer may
	// write the device's doorbell, bellMR (announced in the hello).
	bufSize   int
	bellMR    *nic.MemoryRegion
	replyDue  atomic.Bool // a message went out since the poller last slept
	replyLook bool        // block mode with a ReplyWait: replyDue is kept
	replySpin shm.WaitStrategy
	reply     replyLook // awaitReply's wait, the poller's

	// What the peer announced in its hello.
	helloDone   bool
	version     uint16
	dialer      bool
	window      uint32 // messages the peer may send unacknowledged
	peerWindow  uint32 // receive buffers the peer granted us
	peerBufSize int
	peerRead    bool // the peer performs RDMA Reads: use the read rendezvous
	peerStages  bool // the peer's last done said it read through staging
	offerRead   bool // we do: accept read rendezvous
	peerMaxXfer int
	peerBell    uint64
	peerBellKey uint64
	maxPayload  int // largest payload of one message to the peer
	maxInline   int // messages of at most this many bytes are sent inline, unsignaled

	// Credits (see docs/protocol.md). All counts wrap at 2^32 and are
	// compared by unsigned differences.
	sent          uint32 // messages we sent
	peerAck       uint32 // how many of them the peer consumed (its last ack)
	lastNonCredit uint32 // sent, as of our last message that was not a credit
	received      uint32 // messages the peer sent us that arrived
	consumed      uint32 // how many of them we are done with (read, or handled)
	ackSent       uint32 // consumed, as of our last message (what the peer knows)
	owed          int    // non-credit messages consumed since ackSent
	ctlq          []ctlMsg

	// Receive side.
	// WriteTo lends a received message's bytes, where they lie in the
	// ring, to its destination's Write with no lock held (copy.go): the
	// ring is not given back from lendStart on, and acks go no further
	// than lendAck, until the lend ends; teardown waits for it (lendWait).
	lending   bool
	lendStart uint64
	lendAck   uint32
	lendWait  chan struct{}
	rx        []rxEntry // received data, in stream order, from rxHead
	rxHead    int
	peerFin   bool
	nextRx    uint32 // id of the peer's next rts
	rd        recvOp // the rendezvous receive operation in progress
	stage     []byte // staging buffer (temporary memory), nil when none
	staged    []byte // unread bytes in stage

	// Send side.
	nextTx        uint32
	txq           []*txfer // read rendezvous waiting for done, in order
	wtx           *txfer   // write rendezvous in progress
	lastCancelled uint32   // id of the last cancelled write rendezvous, +1 (0: none)
	copyInFlight  int
	lastDone      time.Time // when the peer's last done arrived (pieceCopier)
	// The source choice's memory of the application: the previous large
	// write's buffer, and whether this write reuses it.
	lastWrite, lastWriteLen uintptr
	reused                  bool
	// Split transfers: the peer did not split our last offer, so offer
	// none before this; and the last source and Read buffer found in huge
	// pages (sys.CollapseHuge need not be asked again).
	noSplitUntil     time.Time
	eagerUntil       time.Time // large writes go as small messages until then (lowmem.go)
	bigWrite         bool      // this write is too large to pin in place (lowmem.go)
	hugeSrc, hugeDst span
	lastRead         span // the last direct Read's buffer (acceptSplitLocked)

	// Terminal state.
	err       error // the connection failed: abort (ours) or reset (the peer's)
	errDrain  bool  // deliver received data before err (a reset, not an abort)
	qpDead    bool  // the queue pair is in the error state
	closed    bool  // Close was called
	wclosed   bool  // fin queued: no more writes
	tearing   bool  // teardown started
	abortSent bool  // we sent an abort message
	torn      bool  // registrations released
}

// span is a range of memory [addr, addr+n).
type span struct{ addr, n uintptr }

// covers reports whether b lies inside s.
func (s span) covers(b []byte) bool {
	a := mem.Addr(b)
	return s.n > 0 && a >= s.addr && a+uintptr(len(b)) <= s.addr+s.n
}

// rxEntry is one received message that the application has not read.
type rxEntry struct {
	kind msgType // msgData, msgRTS or msgFin
	// held: data aliases the incoming ring, whose space from start on is
	// given back once the entry is read (or its bytes moved to the heap).
	held  bool
	start uint64
	seq   uint64 // the message's number among those taken (holdLocked)
	data  []byte // unread inline bytes
	// rts:
	id         uint32
	size, off  uint32 // rendezvous bytes, and how many were taken
	read       bool   // read rendezvous
	staged     bool   // some of it came through the staging buffer
	split      bool   // the sender offers to split it (flagSplit)
	addr, rkey uint64 // the source (read rendezvous)
}

// recvOp is the rendezvous receive in progress: an RDMA Read we posted
// (read rendezvous) or a sink we exposed with a cts (write rendezvous).
type recvOp struct {
	active    bool
	direct    bool // into the Read's buffer (else the staging buffer)
	nt        bool // written around the caches (SendWR.NonTemporal)
	read      bool
	id        uint32
	off, n    uint32 // the chunk: offset in the transfer and length
	mr        *nic.MemoryRegion
	done      bool // completed: the RDMA Read finished, or done arrived
	cancelled bool // the sender cancelled the transfer instead
	err       error
	// A split transfer (read rendezvous, flagSplit): we RDMA-Read the
	// head, [off, tailOff), and the sender RDMA-Writes the tail,
	// [tailOff, +tailLen), into the same registration; done is both.
	split            bool
	readDone         bool // our RDMA Read of the head completed
	tailDone         bool // the sender's done for the tail arrived
	tailOff, tailLen uint32
}

// txfer is one rendezvous we send.
type txfer struct {
	id   uint32
	read bool
	size uint32
	src  []byte // the data: the application's buffer or temp
	temp []byte // temporary memory to give back; nil for zero copy
	mr   *nic.MemoryRegion
	done bool
	// A copied piece that pieceCopier timed: its way, the copy's time,
	// and when the rts left (the reader could start).
	nt     bool
	copyD  time.Duration
	sentAt time.Time
	// write rendezvous:
	cts            bool // a cts waits to be served
	ctsOff, ctsLen uint32
	ctsAddr        uint64
	ctsKey         uint64
	off            uint32 // bytes written
	writing        bool   // an RDMA Write is in flight
	werr           error
	// split transfer (a zero-copy read rendezvous offered with flagSplit):
	// the peer may ask for one tail with a cts, which we then write.
	split     bool
	tailAsked bool // the peer's cts for the tail arrived
	tailSent  bool // the tail's RDMA Write posted and its done queued
}

// ctlMsg is a control message waiting for a credit.
type ctlMsg struct {
	typ           msgType
	flags         uint8
	id, size, off uint32
	addr, rkey    uint64
}

// Stats returns a snapshot of the connection's counters.
func (c *Conn) Stats() Counters { return c.stats.snapshot() }

// LocalAddr returns the local address.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.setCheck("set deadline"); err != nil {
		return err
	}
	c.rdl.set(t)
	c.wdl.set(t)
	c.wake()
	return nil
}

// SetReadDeadline sets the deadline of Read calls, pending ones included.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if err := c.setCheck("set read deadline"); err != nil {
		return err
	}
	c.rdl.set(t)
	c.wake()
	return nil
}

// SetWriteDeadline sets the deadline of Write calls, pending ones included.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if err := c.setCheck("set write deadline"); err != nil {
		return err
	}
	c.wdl.set(t)
	c.wake()
	return nil
}

func (c *Conn) setCheck(op string) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return c.opErr(op, net.ErrClosed)
	}
	return nil
}

// opErr wraps err as the *net.OpError of op.
func (c *Conn) opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: c.netw, Source: c.laddr, Addr: c.raddr, Err: err}
}

// Read reads stream bytes into b. It returns io.EOF after the peer's
// graceful close, os.ErrDeadlineExceeded (wrapped) when the read deadline
// passes, net.ErrClosed after Close, an error matching
// syscall.ECONNRESET when the peer reset the connection, and one matching
// syscall.EFAULT after the bytes delivered when b's memory faulted.
func (c *Conn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	n, err := c.read(b)
	c.rmu.Unlock()
	if n > 0 {
		c.stats.count(cBytesRead, uint64(n))
	}
	traceIO(c, ioRead, n, err) // tools/sdtrace: trace.go
	return n, c.opErr("read", err)
}

// Write writes b. Small writes travel inside control messages, large ones
// by rendezvous; short of locked memory, registrations or temporary
// memory, by a path that needs less (see the package documentation). A
// fault of b's memory returns the bytes accepted before it and an error
// matching syscall.EFAULT.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	n, err := c.write(b)
	c.wmu.Unlock()
	traceIO(c, ioWrite, n, err) // tools/sdtrace: trace.go
	return n, c.opErr("write", err)
}

// CloseWrite ends the stream towards the peer, which reads io.EOF after
// the data written so far. Reads go on.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return c.opErr("close", net.ErrClosed)
	case c.err != nil:
		return c.opErr("close", c.err)
	case c.wclosed:
		return nil
	}
	c.wclosed = true
	c.queueCtlLocked(ctlMsg{typ: msgFin})
	c.ensurePumpLocked()
	return nil
}

// Close closes the connection. Pending Reads and Writes return
// net.ErrClosed. What was written is still delivered: the connection
// lingers (Config.Linger at most) until the peer has consumed it, then
// releases its registrations and its queue pair. A Close with received
// data left unread resets the connection instead, as TCP does.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	close(c.closing)
	c.wakeLocked()
	c.mu.Unlock()
	// Let the calls in flight return; later ones see closed.
	quiesce.Wait(&c.rmu, &c.wmu)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.tearing:
	case c.err != nil || c.qpDead:
		c.teardownLocked()
	case c.unreadLocked():
		c.abortLocked(&abortError{err: errUnread})
	default:
		if !c.wclosed {
			c.wclosed = true
			c.queueCtlLocked(ctlMsg{typ: msgFin})
		}
		c.tearing = true
		lingerStart()
		go c.linger()
	}
	return nil
}

// read is Read without the error wrapping; the caller holds rmu.
func (c *Conn) read(b []byte) (n int, err error) {
	c.mu.Lock()
	c.readN = 0
	// One return here keeps the defer open-coded: with readLoopLocked's
	// many returns it was a stack-allocated record, run through the
	// runtime's defer machinery on every Read (docs/performance.md,
	// "Read's defers"). It also ends the region in which a fault of b's
	// memory is recovered (fault.go).
	defer c.endRead(b, debug.SetPanicOnFault(true), &n, &err)
	return c.readLoopLocked(b)
}

// readLoopLocked is read with c.mu held.
func (c *Conn) readLoopLocked(b []byte) (int, error) {
	n := 0
	for {
		// A direct receive writes into b: it must end before Read returns.
		direct := c.rd.active && c.rd.direct
		if !direct {
			var err error
			switch {
			case c.closed:
				err = net.ErrClosed
			case c.err != nil && !c.errDrain:
				err = c.err
			case n == 0 && c.rdl.expired.Load():
				err = os.ErrDeadlineExceeded
			}
			if err != nil {
				if n > 0 {
					return n, nil
				}
				return 0, err
			}
		}
		if len(b) == 0 {
			return 0, nil
		}
		m, wait, err := c.readLocked(b, n)
		n = m
		c.pumpLocked() // credit for what was consumed
		switch {
		case err != nil:
			if n > 0 {
				return n, nil // the error comes again at the next Read
			}
			return 0, err
		case !wait:
			return n, nil
		case n > 0 && !c.rd.active:
			return n, nil
		case !c.rd.active && (c.err != nil || c.qpDead):
			// Nothing more can come.
			if c.err != nil {
				return 0, c.err
			}
			return 0, &resetError{reason: "peer gone"}
		}
		direct = c.rd.active && c.rd.direct
		dl := &c.rdl
		if direct {
			dl = nil // bounded: our own RDMA Read, or a sender serving our cts
		}
		gen := c.rounds
		c.mu.Unlock()
		perr := c.progress(gen, dl, !direct)
		c.mu.Lock()
		if perr != nil && !direct {
			if n > 0 {
				return n, nil
			}
			return 0, perr
		}
	}
}

// write is Write without the error wrapping; the caller holds wmu.
func (c *Conn) write(b []byte) (n int, err error) {
	c.mu.Lock()
	c.writeN = 0
	defer c.endWrite(b, debug.SetPanicOnFault(true), &n, &err) // fault.go
	if err := c.writableLocked(); err != nil {
		return 0, err
	}
	if c.wdl.expired.Load() {
		return 0, os.ErrDeadlineExceeded
	}
	large := !c.eagerLocked(len(b))               // eager.go
	c.bigWrite = large && !c.dev.pinnable(len(b)) // lowmem.go
	if large {
		// What the source choice learns from: is this the buffer of the
		// previous large write (the application reuses its buffers)?
		a := mem.Addr(b)
		c.reused = a >= c.lastWrite && a-c.lastWrite < c.lastWriteLen
		defer func() { c.lastWrite, c.lastWriteLen = a, uintptr(len(b)) }()
	}
	for n < len(b) {
		var m int
		c.writeN = n
		if rest := b[n:]; !large || len(rest) <= c.maxPayload {
			m, err = c.sendDataLocked(rest)
		} else {
			m, err = c.sendLargeLocked(rest)
		}
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writableLocked tells why Write cannot go on, or nil.
func (c *Conn) writableLocked() error {
	switch {
	case c.closed:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case c.qpDead:
		return &resetError{reason: "peer gone"}
	case c.wclosed:
		return syscall.EPIPE
	}
	return nil
}

// unreadLocked tells whether received data is waiting for Read.
func (c *Conn) unreadLocked() bool {
	if len(c.staged) > 0 {
		return true
	}
	for i := c.rxHead; i < len(c.rx); i++ {
		if c.rx[i].kind != msgFin {
			return true
		}
	}
	return false
}

// wake makes waiting calls look at the state again (deadlines changed).
func (c *Conn) wake() {
	c.mu.Lock()
	c.wakeLocked()
	c.mu.Unlock()
}

// wakeLocked wakes the goroutines waiting for progress and a poller that
// spins or sleeps.
func (c *Conn) wakeLocked() {
	c.kick.Add(1)
	c.rounds++
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
	c.ringBellLocked()
}
