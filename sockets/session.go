package sockets

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// The session: a connection's protocol state (session and the records it
// keeps of transfers and queued messages), and the progress engine that
// polls the completion queue, one goroutine at a time, and wakes the others.

// Work request ids: the kind in the top byte, an index below.
const (
	wrRecv  uint64 = 1 << 56
	wrSend  uint64 = 2 << 56
	wrRead  uint64 = 3 << 56
	wrWrite uint64 = 4 << 56
	wrBell  uint64 = 5 << 56
	// An inline send, unsignaled: its buffer is free when PostSend
	// returns; only a failure completes.
	wrSendInline uint64 = 6 << 56
	wrKind       uint64 = 0xff << 56
)

// session is the protocol state of a connection, guarded by Conn.mu.
type session struct {
	// Progress: one goroutine at a time polls the completion queue (the
	// poller); the others wait for changed to be closed.
	polling  bool
	sleeping bool // the poller waits in CompletionQueue.Wait
	pumping  bool // a goroutine drives the connection for ctlq
	// Which halves of Conn.mu the fast paths hold (connMu): recvOnly, the
	// receive side's, is set while a Read holds recv alone; sendOnly, the
	// send side's, while a Write holds send alone.
	recvOnly, sendOnly bool
	// The incoming ring (nic.QPOptions.InPlace): messages are read where
	// they lie. inPos is the ring position after the last one taken,
	// relPos how far the ring is given back; a message the application has
	// not read holds its space (rxEntry.held), and so do the messages
	// after it.
	inPos, relPos uint64
	reserved      bool          // sendLocked holds a reservation in the ring to the peer
	taken         uint64        // credit units of the messages taken from the ring (unitsOf)
	lastUnits     uint32        // the units of the message taken last (nextMsgLocked)
	heldN         int           // credit units of the rx entries that hold ring space
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
	maxPayload  int // largest payload of one message to the peer: one credit's
	maxData     int // largest payload of one data message: maxPayload, or two credits' (unitsVersion)
	maxInline   int // messages of at most this many bytes are sent inline, unsignaled

	// Credits (see docs/protocol.md). All counts are of credit units — a
	// message counts one, a data message of more than maxPayload bytes two
	// (unitsOf) — wrap at 2^32 and are compared by unsigned differences.
	// sent and ackSent are the send side's, peerAck and ackPub the
	// receive side's; each is read by the other side's fast path (connMu).
	sent          pub32  // units of the messages we sent
	peerAck       pub32  // how many of them the peer consumed (its last ack)
	lastNonCredit uint32 // sent, as of our last message that was not a credit
	received      uint32 // units of the messages the peer sent us that arrived
	consumed      uint32 // how many of them we are done with (read, or handled)
	ackSent       pub32  // the ack our last message carried (what the peer knows)
	// ackPub is the ack a message may carry now (ackableLocked), as of the
	// last release of ring space (releaseLocked): what a fast Write, which
	// cannot release, puts in its messages.
	ackPub pub32
	owedAt uint32 // consumed, as of the last message we consumed that was not a credit
	ctlq   []ctlMsg

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
	noSplitUntil time.Time
	eagerUntil   time.Time // large writes go as small messages until then (lowmem.go)
	bigWrite     bool      // this write is too large to pin in place (lowmem.go)
	waitedWrite  bool      // this write found no copy of ours in flight (copyChunk)
	// The source choice's measurements (sourceLearner) and the write
	// being measured: the way asked for, whether a piece went the other
	// way (mixed: no sample), when it started and its bytes.
	learn            sourceLearner
	lw               bool // this write is measured
	lwZC, lwMixed    bool
	lwStart          time.Time
	lwBytes          int
	hugeSrc, hugeDst span
	lastRead         span // the last direct Read's buffer (acceptSplitLocked)

	// Terminal state.
	err       error // the connection failed: abort (ours) or reset (the peer's)
	errDrain  bool  // deliver received data before err (a reset, not an abort)
	qpDead    bool  // the queue pair is in the error state: no more sends
	qpReason  error // why it is
	ringEnd   bool  // nothing more comes in the ring (ringEndLocked)
	closed    bool  // Close was called
	wclosed   bool  // fin queued: no more writes
	tearing   bool  // teardown started
	abortSent bool  // we sent an abort message
	torn      bool  // registrations released
}

// pub32 is a count one side of the connection writes under its half of
// Conn.mu and the other side's fast path reads under the other half. The
// writer stores it with store (a plain store: stats_fast.go), the reader
// loads it atomically. Stale reads are safe by construction: a stale
// peerAck or ackPub only holds back credit, and sent and ackSent are stored
// before the commit of the message that lets the peer act on them, so that
// the receive side, which sees the peer's answer only after that commit,
// sees them too.
type pub32 struct{ v uint32 }

// load reads the count as its writer last stored it.
func (p *pub32) load() uint32 { return atomic.LoadUint32(&p.v) }

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
	seq   uint64 // the credit units taken before the message (holdLocked)
	units uint32 // the credits it counts (unitsOf)
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
	// The last piece of a measured write (sourceLearner): when the write
	// started, its bytes (0: not measured) and its way.
	learnStart time.Time
	learnBytes int
	learnZC    bool
	// write rendezvous:
	cts            bool // a cts waits to be served
	ctsOff, ctsLen uint32
	ctsAddr        uint64
	ctsKey         uint64
	off            uint32 // bytes written
	writing        bool   // an RDMA Write is in flight
	wOff, wLen     uint32 // its chunk (a cts for the next may come first)
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

// progress polls the completion queue once, waiting as the configuration
// says, and dispatches what it finds; or, when another goroutine polls,
// waits for that one's next round. It returns os.ErrDeadlineExceeded when
// dl passes (nil: no deadline) and net.ErrClosed after Close if
// stopOnClose. The caller holds no lock and rechecks its condition; gen
// is c.rounds when it checked, under mu: when a round ended since, the
// condition may hold already and progress returns at once (waiting then
// would miss the wake-up: a cts dispatched by another poller while the
// writer was between its check and its wait hung the write rendezvous).
func (c *Conn) progress(gen uint32, dl *deadline, stopOnClose bool) error {
	c.mu.Lock()
	err := c.progressLocked(gen, dl, stopOnClose, false)
	c.mu.Unlock()
	return err
}

// progressLocked is progress called and returning with mu held; mu is
// released while it waits. A Read may call it holding mu's receive half
// alone (recvOnly); it returns holding both, or, with leave, the receive
// half alone again when the fast path may take what the wait found. A caller that held mu since it checked its
// condition passes c.rounds as gen. Between the wait's end and the
// dispatch of what it found mu is taken once (pollCQ), not three times
// as a waiting Read once took it (docs/performance.md, "A waiting Read's
// locks"). leave: when the wait found messages in the ring and nothing
// else, and the Read's fast path may take them (fastReadyLocked), they
// stay there for the caller, a Read, to take at once (readFastLocked),
// instead of going through the receive queue.
func (c *Conn) progressLocked(gen uint32, dl *deadline, stopOnClose, leave bool) error {
	if c.torn {
		return net.ErrClosed
	}
	if c.rounds != gen {
		return nil // the state changed since the caller looked
	}
	if c.polling {
		c.stats.count(cPollerWaits, 1)
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		ch := c.changed
		c.unlockHeld()
		var dch, cch chan struct{}
		if dl != nil {
			dch = dl.wait()
		}
		if stopOnClose {
			cch = c.closing
		}
		var err error
		select {
		case <-ch:
		case <-dch:
			err = os.ErrDeadlineExceeded
		case <-cch:
			err = net.ErrClosed
		}
		c.mu.Lock()
		return err
	}
	c.polling = true
	c.interesting = false
	k := c.kick.Load()
	c.unlockHeld() // both halves, or a Read's receive half
	var err error
	for {
		var n int
		n, err = c.pollCQ(dl, k, leave) // returns with mu held, or its receive half
		if leave && n == 0 && err == nil && c.fastReadyLocked() {
			break
		}
		c.upgradeLocked()
		c.dispatchPolledLocked(n)
		// Completions of our own sends change nothing a caller waits
		// for, unless it waits for a send buffer: poll on.
		if c.interesting || c.wantSend || n == 0 || err != nil || c.changed != nil || c.kick.Load() != k {
			break
		}
		c.mu.Unlock()
	}
	c.endPollLocked()
	return err
}

// upgradeLocked makes the holder of the receive half hold both: a fast
// Read that meets what only the general path handles (connMu). Under both
// it does nothing.
func (c *Conn) upgradeLocked() {
	if c.recvOnly {
		c.mu.send.Lock()
		c.recvOnly = false
	}
}

// waitLocked runs progress, mu released while it waits.
func (c *Conn) waitLocked(dl *deadline, stopOnClose bool) error {
	return c.progressLocked(c.rounds, dl, stopOnClose, false)
}

// endPollLocked ends a poller's round and wakes the calls that waited for
// it.
func (c *Conn) endPollLocked() {
	c.polling = false
	c.rounds++
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// pollNowLocked takes the completions that are there, if no other call
// is polling, and dispatches them; it never waits. It releases mu while it
// polls (the nic may run queued RDMA work then).
func (c *Conn) pollNowLocked() {
	if c.polling || c.torn {
		return
	}
	c.polling = true
	c.mu.Unlock()
	n := c.cq.Poll(c.comps[:])
	c.mu.Lock()
	c.dispatchPolledLocked(n)
	c.endPollLocked()
}

// pollInlineLocked takes the messages that are in the ring already, as a
// poller's round run under mu from start to end, and tells whether there
// were any: a Read that finds its data there has no need to release mu,
// become the poller and take it again. Only when no other call polls and
// no RDMA operation of the connection can be outstanding (no rendezvous
// either way): a poller dispatches the completions of those before the
// messages that came after them, and this looks at the ring alone.
func (c *Conn) pollInlineLocked() bool {
	if c.polling || c.torn || c.rd.active || c.wtx != nil || len(c.txq) > 0 || c.copyInFlight > 0 || !c.qp.RecvPending() {
		return false
	}
	c.polling = true
	taken := c.taken
	c.dispatchPolledLocked(0) // the ring's messages, then what they let us send
	c.endPollLocked()
	if c.taken == taken {
		return false
	}
	c.stats.count(cInlineTakes, 1)
	return true
}

// pollCQ waits for completions into c.comps. The caller is the poller;
// k is the kick count it started with: a change ends the wait. It is
// called without mu and returns with mu held, for the dispatch; with
// leave, when it found no completion (only messages in the ring, for a
// Read's fast path to take), with mu's receive half alone (recvOnly).
func (c *Conn) pollCQ(dl *deadline, k uint32, leave bool) (int, error) {
	comps := c.comps[:]
	if n := c.cq.Poll(comps); n > 0 || c.qp.RecvPending() {
		c.lockPolled(leave && n == 0)
		return n, nil
	}
	if c.replyLook && c.replyDue.Swap(false) {
		if n, ok := c.awaitReply(comps, dl, k); ok {
			c.lockPolled(leave && n == 0)
			c.stats.count(cRepliesCaught, 1)
			return n, nil
		}
	}
	var t time.Time
	if dl != nil {
		t = dl.when()
	}
	c.mu.Lock()
	c.repostLocked() // the peer's next message must find a buffer
	c.sleeping = true
	c.mu.Unlock()
	var n int
	var err error
	if c.kick.Load() == k && !(dl != nil && dl.expired.Load()) {
		c.stats.count(cSleeps, 1)
		var how shm.Outcome
		if c.qp.Taken() || c.cfg.Wait.Mode != shm.WaitAdaptive {
			n, how, err = c.cq.WaitOutcome(comps, t)
		} else {
			// An early dial its listener has not taken yet: the
			// answer needs the listener's accept and handshake first,
			// longer than a spin, and the connect woke the listener's
			// thread on this CPU, where a spin would hold it off
			// (docs/setup.md, "Waits before the listener's reply").
			n, how, err = c.cq.WaitParkedOutcome(comps, t)
		}
		switch how {
		case shm.WaitedSpun:
			c.stats.count(cWaitsSpun, 1)
		case shm.WaitedSlept:
			c.stats.count(cWaitsParked, 1)
		}
	}
	c.lockPolled(leave && n == 0 && err == nil)
	c.sleeping = false
	c.repostLocked()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if dl != nil && dl.expired.Load() {
				return 0, os.ErrDeadlineExceeded
			}
			return 0, nil // the deadline moved
		}
		return 0, err
	}
	return n, nil
}

// lockPolled takes mu after a poll: its receive half alone if recvOnly,
// for a Read's fast path.
func (c *Conn) lockPolled(recvOnly bool) {
	if recvOnly {
		c.mu.recv.Lock()
		c.recvOnly = true
		return
	}
	c.mu.Lock()
}

// awaitReply polls for Config.ReplyWait, in block mode, after this side
// sent a message: the answer to it may be on its way, and finding it costs
// less than a sleep and a wake-up. It spins (shm.WaitStrategy, busy) and
// returns how many completions it took and whether anything came (a
// message in the ring, or completions); false when the wait was kicked,
// its deadline passed or nothing came. The caller is the poller.
func (c *Conn) awaitReply(comps []nic.Completion, dl *deadline, k uint32) (int, bool) {
	c.reply = replyLook{c: c, comps: comps, dl: dl, k: k}
	c.replySpin.Wait(&c.reply, nil, time.Now().Add(c.cfg.ReplyWait))
	r := c.reply
	c.reply = replyLook{}
	return r.n, r.got
}

// replyLook is awaitReply's wait: a poll of the completion queue and the
// ring, ended early by a kick or the deadline.
type replyLook struct {
	c     *Conn
	comps []nic.Completion
	dl    *deadline
	k     uint32
	n     int
	got   bool
}

func (r *replyLook) Ready() bool {
	c := r.c
	if r.n = c.cq.Poll(r.comps); r.n > 0 || c.qp.RecvPending() {
		r.got = true
		return true
	}
	return c.kick.Load() != r.k || r.dl != nil && r.dl.expired.Load()
}

func (r *replyLook) Arm(uint32) {} // it never parks

// ringBellLocked wakes the poller waiting in CompletionQueue.Wait (it
// spins or is parked there).
func (c *Conn) ringBellLocked() {
	if c.sleeping {
		c.stats.count(cDoorbells, 1)
		c.cq.Wake()
	}
}
