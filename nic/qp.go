package nic

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	imem "github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// QPState is a queue pair's state: reset until connected, ready, then error
// once anything fails or it is closed.
type QPState uint32

const (
	QPReset QPState = iota
	QPReady
	QPError
)

func (s QPState) String() string {
	return [...]string{"reset", "ready", "error"}[s]
}

// SendWR is a work request for the send queue.
type SendWR struct {
	ID uint64
	Op Opcode // OpSend, OpWrite or OpRead
	// Local is the source of a send or RDMA Write, the destination of an
	// RDMA Read. It must lie in the region named by LKey, except for a send
	// of at most MaxInline bytes, which is copied at post time.
	Local []byte
	LKey  uint32
	// Remote and RKey name the target of an RDMA Write or Read: an address
	// in the peer and the key of the peer's region that holds it.
	Remote uint64
	RKey   uint64
	// Unsignaled asks for no completion when the request succeeds (verbs'
	// IBV_SEND_SIGNALED left off): a failure still completes, with its
	// status, and flushes the queue pair as usual. Useful for sends of at
	// most MaxInline bytes, whose buffer is free when PostSend returns.
	Unsignaled bool
	// NonTemporal asks for the destination of an RDMA Read (Local) or
	// Write (the peer's memory) to be written around the caches
	// (non-temporal stores): for large transfers whose data nobody reads
	// soon, where cached stores would read every destination line in
	// first and evict what the caches hold. Cross-memory (CMA) transfers
	// ignore it (the kernel copies).
	NonTemporal bool
}

// RecvWR posts a buffer for one incoming send.
type RecvWR struct {
	ID   uint64
	Buf  []byte
	LKey uint32 // a region with AccessLocalWrite that holds Buf
}

// postedRecv is a posted receive and the region its buffer lies in.
type postedRecv struct {
	RecvWR
	mr *MemoryRegion
}

type sendOp struct {
	wr       SendWR
	mr       *MemoryRegion // wr.LKey's region, if any; nil for an inline copy
	done     int
	checked  bool
	ent      remoteEntry
	rnrSince time.Time
	rnrHead  uint64 // the peer's ring position when rnrSince was set
}

type peerInfo struct {
	pid      int
	uid      uint32
	attr     Attr
	version  uint16 // of the connection manager's messages
	private  []byte // the peer's private data from the handshake
	table    peerTable
	tableSeg *shm.Segment

	segMu      lockrank.Mutex // guards segs, segChanged, and writes to hot
	segs       map[uint32]*shm.Segment
	segChanged chan struct{} // closed and replaced when segs grows
	// hot caches segs' live entries by index, direct-mapped, for copies to
	// find without segMu: a lookup is one load (docs/performance.md, "An
	// RDMA Write without a lock per lookup"). Written under segMu; an entry
	// is cleared before its segment is retired, and a copy that loaded it
	// before holds sqMu, which the retirement waits out.
	hot [peerSegHot]atomic.Pointer[hotSeg]
}

// peerSegHot is the size of peerInfo.hot: a connection's peer has a few
// memory segments, one per 64 MiB or so of device memory it allocated.
const peerSegHot = 16

// hotSeg is an entry of peerInfo.hot.
type hotSeg struct {
	idx uint32
	seg *shm.Segment
}

// unhotLocked drops segment idx from the hot cache; the caller holds segMu.
func (p *peerInfo) unhotLocked(idx uint32) {
	if h := p.hot[idx%peerSegHot].Load(); h != nil && h.idx == idx {
		p.hot[idx%peerSegHot].Store(nil)
	}
}

// QueuePair is a connected pair of send and receive queues. It is safe for
// concurrent use; work requests on one queue pair complete in the order
// they were posted.
type QueuePair struct {
	dev            *Device
	sendCQ, recvCQ *CompletionQueue
	conn           *net.UnixConn
	connMu         lockrank.Mutex // serializes writes to conn
	seg            *shm.Segment
	// What becomes of seg at Close (qppool.go): the dialer pools it for
	// the next dial to poolKey's process (non-nil when its fd is kept);
	// the acceptor's import (segImported) is marked free and parked.
	poolKey     *qpPoolKey
	segCap      int
	segImported bool
	out         *shm.Producer
	in          *shm.Consumer
	note        *shm.Notifier // wakes the peer's waiters
	inlineMax   int           // sends of at most this many bytes take postInline
	inPlace     bool          // sends and receives are the owner's, in the rings (QPOptions.InPlace)
	peer        peerInfo

	// Lock order: sqMu, then rqMu, then CQ locks.
	sqMu     lockrank.Mutex // guards sq, queued, closed, out; held while an op runs
	sq       []*sendOp
	sqLen    atomic.Int32 // len(sq), for pollers that look without the lock
	queued   bool         // has work for the engine (on its list, or to be)
	inEngine bool         // on one of the engine's lists; guarded by the engine's mu
	// polledAt is when a poller last ran a turn of queued work (monotonic
	// nanoseconds since clockBase): the engine leaves the queue pair to its
	// pollers for engineYield after that, without taking sqMu.
	polledAt atomic.Int64
	closed   bool // mappings released (also guarded by rqMu: both held to set)

	rqMu   lockrank.Mutex // guards rq, rqHead, in
	rq     []postedRecv
	rqHead int
	// rqAny tells pollers that look without the lock whether a receive
	// is posted. Stored under rqMu, and only when that changes: a locked
	// store per message would sit on a ping-pong's path.
	rqAny atomic.Bool

	state     atomic.Uint32
	reason    atomic.Pointer[error]
	closeOnce sync.Once
	retireMu  lockrank.Mutex
	retiring  int                 // unmaps of segments the peer freed, under way
	retired   chan struct{}       // closed when retiring drops to 0
	announced map[uint32]struct{} // our memory segments the peer has; under connMu
	// An early dial's (known.go): the answer it runs on, whose reply the
	// connection reader takes first, by awaitBy.
	awaiting   *knownPeer
	awaitNamed bool // the hello named awaiting's files (cmFlagHeld)
	awaitKey   knownKey
	awaitBy    time.Time
	replied    atomic.Bool // the early dial's reply came and matched
	heldReply  atomic.Bool // and it came without fds (Stats.HeldReplies)
	started    atomic.Bool // the connection reader runs
	readerDone chan struct{}

	sstats Stats // send-side counters; guarded by sqMu
	rstats Stats // receive-side counters; guarded by rqMu

	// rdmaLast is what the last small RDMA operation run at post time
	// validated; guarded by sqMu (postRDMARepeat). rdmaKey is its remote
	// key, for a look without the lock: a request with another key goes
	// the general way without taking sqMu twice.
	rdmaLast rdmaTranslation
	rdmaKey  atomic.Uint64
}

// rdmaTranslation is a small RDMA operation's validated translation: its
// opcode, its local key and region, and the peer's registration entry for
// its remote key as lookup read it. mr is compared with the device's
// table before use, so a deregistered region never serves; holding it
// keeps its buffer from the collector until the next operation replaces it.
type rdmaTranslation struct {
	op   Opcode
	lkey uint32
	mr   *MemoryRegion
	rkey uint64
	ent  remoteEntry
}

// Stats returns the queue pair's counters.
func (qp *QueuePair) Stats() Stats {
	qp.sqMu.Lock()
	st := qp.sstats
	qp.sqMu.Unlock()
	qp.rqMu.Lock()
	st.add(&qp.rstats)
	qp.rqMu.Unlock()
	if qp.heldReply.Load() {
		st.HeldReplies++
	}
	return st
}

// State returns the queue pair's state.
func (qp *QueuePair) State() QPState { return QPState(qp.state.Load()) }

// Err returns why the queue pair is in the error state, or nil.
func (qp *QueuePair) Err() error {
	if p := qp.reason.Load(); p != nil {
		return *p
	}
	return nil
}

// PeerAttr returns the attributes the peer's device announced.
func (qp *QueuePair) PeerAttr() Attr { return qp.peer.attr }

// PeerPID returns the peer's process id, as the kernel reported it.
func (qp *QueuePair) PeerPID() int { return qp.peer.pid }

// PeerPrivateData returns the private data the peer sent with the
// handshake (QPOptions.PrivateData), nil if none; peer input, to be
// validated by whoever reads it.
func (qp *QueuePair) PeerPrivateData() []byte { return qp.peer.private }

func (qp *QueuePair) stateErr() error {
	if err := qp.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrQPState, err)
	}
	return ErrQPState
}

// PostSend queues a send, RDMA Write or RDMA Read.
func (qp *QueuePair) PostSend(wr SendWR) error {
	if wr.Op == OpSend {
		if qp.inPlace {
			return errInPlace
		}
		if len(wr.Local) <= qp.inlineMax {
			return qp.postInline(&wr)
		}
	} else if qp.postRDMARepeat(&wr) {
		return nil
	}
	return qp.postSend(&wr)
}

// postRDMARepeat runs wr now if it is a small RDMA Write or Read with the
// opcode and keys of the last one that ran at post time, through that
// one's translation, and reports whether it did; otherwise (or when
// anything changed) PostSend takes its general path, which validates
// everything again and reports what is wrong.
//
// What it still checks per operation: the local region is still
// registered and holds the buffer; the peer's entry is unchanged (its
// sequence word, one load) and holds the range; the peer's segment is
// still mapped (its hot entry, under sqMu, which a retirement waits out);
// the queue pair is ready with nothing queued ahead. What it skips is the
// lookups, which sat between an application seeing a peer's answer and
// the store of its next write: write_lat's one-way latency went from
// about 45 ns over a plain store to within a few ns of it
// (docs/performance.md, "A repeated RDMA operation").
func (qp *QueuePair) postRDMARepeat(wr *SendWR) bool {
	n := len(wr.Local)
	cfg := &qp.dev.cfg
	if n == 0 || n > cfg.InlineExec || n > cfg.Chunk || qp.rdmaKey.Load() != wr.RKey {
		return false
	}
	qp.sqMu.Lock()
	t := &qp.rdmaLast
	mr := t.mr
	if mr == nil || t.op != wr.Op || t.lkey != wr.LKey || t.rkey != wr.RKey ||
		qp.state.Load() != uint32(QPReady) || len(qp.sq) != 0 ||
		qp.dev.regs[mr.idx].Load() != mr || !imem.Within(wr.Local, mr.buf) {
		qp.sqMu.Unlock()
		return false
	}
	e := &t.ent
	raddr, size := wr.Remote, uint64(n)
	h := qp.peer.hot[e.seg%peerSegHot].Load()
	if raddr < e.addr || size > e.length || raddr-e.addr > e.length-size ||
		!qp.peer.table.stillLive(wr.RKey, e.seq) || h == nil || h.idx != e.seg {
		qp.sqMu.Unlock()
		return false
	}
	seg := h.seg.Bytes()
	off := e.segOff + (raddr - e.addr)
	if off > uint64(len(seg)) || size > uint64(len(seg))-off {
		qp.sqMu.Unlock()
		return false
	}
	dst, src := seg[off:off+size], wr.Local
	if wr.Op == OpRead {
		dst, src = src, dst
	}
	way := copyCached
	if wr.NonTemporal {
		way = copyNT
	}
	if mr.stable {
		copyBy(dst, src, way)
	} else if safeCopyBy(dst, src, way) != nil {
		// The general path copies again, fails the same way and
		// completes the request with the fault.
		qp.sqMu.Unlock()
		return false
	}
	qp.sstats.InlineExecs++
	qp.finishSend(wr, n, StatusSuccess, nil)
	qp.sqMu.Unlock()
	if testHookRDMARepeat != nil {
		testHookRDMARepeat()
	}
	return true
}

// testHookRDMARepeat, when set, runs after postRDMARepeat served a request.
var testHookRDMARepeat func()

// postInline is PostSend's path for a send of at most inlineMax bytes: the
// message goes into the peer's ring now, in one pass with nothing looked
// up twice — it is most of a small message's software cost. With work
// queued ahead, or the ring full, it takes the general path.
func (qp *QueuePair) postInline(wr *SendWR) error {
	n := len(wr.Local)
	// Device memory (a live region of this device's segments) needs no
	// fault protection: neither it nor the ring can vanish under the copy.
	plain := qp.dev.devMem(wr.LKey, wr.Local)
	qp.sqMu.Lock()
	if qp.state.Load() != uint32(QPReady) {
		qp.sqMu.Unlock()
		return qp.stateErr()
	}
	if len(qp.sq) != 0 {
		qp.sqMu.Unlock()
		return qp.postSend(wr)
	}
	buf, err := qp.out.Reserve(n, pastDeadline)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			qp.sqMu.Unlock()
			return qp.postSend(wr) // the ring is full: RNR, in the engine
		}
		return qp.failInlineLocked(wr, StatusFlushed, err)
	}
	if plain {
		imem.CopyShared(buf, wr.Local)
	} else if err := safeCopyBy(buf, wr.Local, copyShared); err != nil {
		qp.out.Commit(tagNop, 0) // gives the reservation back; the peer skips it
		return qp.failInlineLocked(wr, StatusLocalAccess, err)
	}
	if err := qp.out.Commit(tagSend, n); err != nil {
		return qp.failInlineLocked(wr, StatusFlushed, err)
	}
	ss := &qp.sstats
	ss.InlineExecs++
	ss.Sends++
	ss.BytesSent += uint64(n)
	if !wr.Unsignaled {
		qp.sendCQ.push(&Completion{ID: wr.ID, Op: OpSend, Status: StatusSuccess, Bytes: n, QP: qp})
	}
	qp.sqMu.Unlock()
	return nil
}

// failInlineLocked completes a failed inline send — the queue pair goes to
// the error state, the failure is on the send CQ before any later request's
// completion, the queue is flushed — and unlocks sqMu.
func (qp *QueuePair) failInlineLocked(wr *SendWR, st Status, reason error) error {
	qp.sstats.InlineExecs++
	failed := qp.finishSend(wr, 0, st, reason)
	qp.sqMu.Unlock()
	if failed {
		qp.flush()
	}
	return nil
}

// pastDeadline is a deadline in the past: Reserve does not wait.
var pastDeadline = time.Unix(0, 1)

// postSend is PostSend's general path.
func (qp *QueuePair) postSend(wr *SendWR) error {
	n := len(wr.Local)
	var mr *MemoryRegion // the local region, when the request names one
	switch wr.Op {
	case OpSend:
		// The dialer chose the ring: its size, not our configuration, bounds
		// a send on this connection.
		if max := qp.out.MaxPayload(); n > max {
			return fmt.Errorf("nic: send of %d bytes exceeds this connection's %d", n, max)
		}
		if n > qp.dev.attr.MaxInline {
			var err error
			if mr, err = qp.dev.localRegion(wr.LKey, wr.Local, 0); err != nil {
				return err
			}
		} else if wr.LKey != 0 {
			// An inline send needs no key (verbs ignore it); a valid one
			// in device memory spares the copy its fault protection.
			mr, _ = qp.dev.localRegion(wr.LKey, wr.Local, 0)
		}
	case OpWrite, OpRead:
		need := Access(0)
		if wr.Op == OpRead {
			if !qp.dev.attr.RDMARead {
				return fmt.Errorf("nic: RDMA Read: %w by this device (Config.RDMARead)", ErrNotSupported)
			}
			need = AccessLocalWrite
		}
		if n > 0 {
			var err error
			if mr, err = qp.dev.localRegion(wr.LKey, wr.Local, need); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("nic: PostSend of %v", wr.Op)
	}
	qp.sqMu.Lock()
	if qp.State() != QPReady {
		qp.sqMu.Unlock()
		return qp.stateErr()
	}
	return qp.postLocked(wr, mr)
}

// postLocked is postSend once the request is checked: it runs wr now
// where it can, else queues it for the engine. The caller holds sqMu,
// which postLocked unlocks.
func (qp *QueuePair) postLocked(wr *SendWR, mr *MemoryRegion) error {
	n := len(wr.Local)
	if len(qp.sq) == 0 && wr.Op == OpSend {
		// The fast path of a send: into the peer's ring now, or queued
		// for the engine when the ring is full.
		if st, reason, finished := qp.sendNow(wr.Local, mr, time.Time{}); finished {
			return qp.finishNowLocked(wr, n, st, reason)
		}
		// The peer's ring is full: the engine retries while the peer makes
		// progress (RNR).
		return qp.enqueueLocked(&sendOp{wr: *wr, mr: mr, rnrSince: time.Now(), rnrHead: qp.out.Released()})
	}
	if len(qp.sq) == 0 && qp.dev.cfg.InlineExec > 0 && n <= qp.dev.cfg.InlineExec && n <= qp.dev.cfg.Chunk {
		// Nothing queued ahead and one chunk at most: run it now, with no
		// record of the operation to build.
		st, reason := qp.rdmaNow(wr, mr)
		return qp.finishNowLocked(wr, n, st, reason)
	}
	if len(qp.sq) == 0 && qp.dev.cfg.InlineExec > 0 {
		// Nothing queued ahead: run it now, up to InlineExec bytes (a send
		// is all or nothing). What is left goes to the engine and to
		// pollers of the send CQ, so posting stays bounded in time.
		op := sendOp{wr: *wr, mr: mr}
		st, reason, finished := qp.execute(&op, qp.dev.cfg.InlineExec, time.Time{})
		if finished {
			qp.sstats.InlineExecs++
			failed := qp.finish(&op, st, reason)
			qp.sqMu.Unlock()
			if failed {
				qp.flush()
			}
			return nil
		}
		queued := new(sendOp) // op itself stays on the stack on the fast path
		*queued = op
		return qp.enqueueLocked(queued)
	}
	return qp.enqueueLocked(&sendOp{wr: *wr, mr: mr})
}

// finishNowLocked completes wr, of n bytes, which ran at post time with
// status st, and unlocks sqMu.
func (qp *QueuePair) finishNowLocked(wr *SendWR, n int, st Status, reason error) error {
	qp.sstats.InlineExecs++
	failed := qp.finishSend(wr, n, st, reason)
	qp.sqMu.Unlock()
	if failed {
		qp.flush()
	}
	return nil
}

// enqueueLocked queues op for the engine and unlocks sqMu. An inline
// send's data is copied now: the caller may reuse its buffer at once.
func (qp *QueuePair) enqueueLocked(op *sendOp) error {
	defer qp.sqMu.Unlock()
	if len(qp.sq) >= qp.dev.cfg.SendDepth {
		return ErrQueueFull
	}
	if op.wr.Op == OpSend && len(op.wr.Local) <= qp.dev.attr.MaxInline {
		op.wr.Local = bytes.Clone(op.wr.Local)
		op.mr = nil
	}
	qp.sq = append(qp.sq, op)
	qp.sqLen.Store(int32(len(qp.sq)))
	if !qp.queued {
		qp.queued = true
		qp.dev.eng.add(qp)
	}
	return nil
}

// finish completes op on the send CQ and, for a failure, moves the queue
// pair to the error state; it reports whether the caller must flush once
// it has released its locks. The caller holds sqMu.
func (qp *QueuePair) finish(op *sendOp, st Status, reason error) bool {
	return qp.finishSend(&op.wr, op.done, st, reason)
}

// finishSend is finish for the request wr that moved bytes.
func (qp *QueuePair) finishSend(wr *SendWR, bytes int, st Status, reason error) bool {
	traceSendDone(qp, wr.ID, wr.Op, bytes, st)
	ss := &qp.sstats
	switch wr.Op {
	case OpSend:
		ss.Sends++
		ss.BytesSent += uint64(bytes)
	case OpWrite:
		ss.Writes++
		ss.BytesWritten += uint64(bytes)
	case OpRead:
		ss.Reads++
		ss.BytesRead += uint64(bytes)
	}
	if st == StatusSuccess {
		if !wr.Unsignaled {
			qp.sendCQ.push(&Completion{ID: wr.ID, Op: wr.Op, Status: st, Bytes: bytes, QP: qp, Reason: reason})
		}
		return false
	}
	ss.Errors++
	// The queue pair is in the error state before its failed completion
	// can be seen.
	failed := qp.setError(&CompletionError{Status: st, Op: wr.Op, ID: wr.ID, Reason: reason})
	qp.sendCQ.push(&Completion{ID: wr.ID, Op: wr.Op, Status: st, Bytes: bytes, QP: qp, Reason: reason})
	return failed
}

// execute moves up to budget more bytes of op. It reports whether op is
// finished and with what status. A send is all or nothing; with a zero
// wait deadline it does not wait for room in the peer's ring. The caller
// holds sqMu.
func (qp *QueuePair) execute(op *sendOp, budget int, wait time.Time) (Status, error, bool) {
	wr := &op.wr
	n := len(wr.Local)
	if wr.Op == OpSend {
		st, err, finished := qp.sendNow(wr.Local, op.mr, wait)
		if finished && st == StatusSuccess {
			op.done = n
		}
		return st, err, finished
	}
	if !op.checked {
		ent, err := qp.peer.table.lookup(wr.RKey, wr.Remote, uint64(n), accessNeeded(wr.Op))
		if err != nil {
			return StatusRemoteAccess, err, true
		}
		op.ent, op.checked = ent, true
	}
	for op.done < n && budget > 0 {
		// A revocation is seen before any byte of the next chunk moves.
		if !qp.peer.table.stillLive(wr.RKey, op.ent.seq) {
			return StatusRemoteAccess, fmt.Errorf("rkey %#x revoked during the transfer", wr.RKey), true
		}
		chunk := min(n-op.done, qp.dev.cfg.Chunk, budget)
		local := wr.Local[op.done : op.done+chunk]
		raddr := wr.Remote + uint64(op.done)
		st, err := qp.copyChunk(wr.Op, local, op.mr, raddr, &op.ent, wr.NonTemporal)
		if err != nil {
			return st, err, true
		}
		op.done += chunk
		budget -= chunk
	}
	return StatusSuccess, nil, op.done == n
}

// rdmaNow runs the RDMA Write or Read wr, of one chunk at most, of region
// mr, and reports its status: execute's work for an operation that needs
// no record. The caller holds sqMu.
func (qp *QueuePair) rdmaNow(wr *SendWR, mr *MemoryRegion) (Status, error) {
	n := len(wr.Local)
	ent, err := qp.peer.table.lookup(wr.RKey, wr.Remote, uint64(n), accessNeeded(wr.Op))
	if err != nil {
		return StatusRemoteAccess, err
	}
	if n == 0 {
		return StatusSuccess, nil
	}
	st, err := qp.copyChunk(wr.Op, wr.Local, mr, wr.Remote, &ent, wr.NonTemporal)
	if err == nil && ent.seg != noSegment {
		qp.rdmaLast = rdmaTranslation{op: wr.Op, lkey: wr.LKey, mr: mr, rkey: wr.RKey, ent: ent}
		qp.rdmaKey.Store(wr.RKey)
	}
	return st, err
}

// accessNeeded is the access an RDMA operation op needs of the peer's
// region.
func accessNeeded(op Opcode) Access {
	if op == OpRead {
		return AccessRemoteRead
	}
	return AccessRemoteWrite
}

// sendNow puts the message b, of region mr (nil: application memory), on
// the ring to the peer, waiting for room until wait (zero: not at all); it
// reports whether the send is finished and with what status. The caller
// holds sqMu.
func (qp *QueuePair) sendNow(b []byte, mr *MemoryRegion, wait time.Time) (Status, error, bool) {
	deadline := wait
	if deadline.IsZero() {
		deadline = time.Unix(0, 1) // in the past: do not wait
	}
	buf, err := qp.out.Reserve(len(b), deadline)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, nil, false
		}
		return StatusFlushed, err, true
	}
	if qp.dev.owns(mr) {
		imem.CopyShared(buf, b) // device memory to ring: neither can vanish
	} else if err := safeCopyBy(buf, b, copyShared); err != nil {
		qp.out.Commit(tagNop, 0) // gives the reservation back; the peer skips it
		return StatusLocalAccess, err, true
	}
	if err := qp.out.Commit(tagSend, len(b)); err != nil {
		return StatusFlushed, err, true
	}
	return StatusSuccess, nil, true
}

// copyChunk moves local, in region mr, to or from the peer's raddr, inside
// entry e. The caller holds sqMu.
func (qp *QueuePair) copyChunk(op Opcode, local []byte, mr *MemoryRegion, raddr uint64, e *remoteEntry, nt bool) (Status, error) {
	if e.seg == noSegment {
		var n int
		var err error
		if op == OpWrite {
			n, err = sys.ProcessVMWritev(qp.peer.pid, local, uintptr(raddr))
		} else {
			n, err = sys.ProcessVMReadv(qp.peer.pid, local, uintptr(raddr))
		}
		if err != nil {
			return StatusRemoteOp, fmt.Errorf("cross-memory %v at %#x: %w", op, raddr, err)
		}
		if n != len(local) {
			return StatusRemoteOp, fmt.Errorf("cross-memory %v at %#x: %d of %d bytes", op, raddr, n, len(local))
		}
		return StatusSuccess, nil
	}
	seg, err := qp.peer.segment(e.seg)
	if err != nil {
		return StatusRemoteAccess, err
	}
	mem := seg.Bytes()
	off := e.segOff + (raddr - e.addr)
	if e.segOff < memDataOff || off < e.segOff || off > uint64(len(mem)) || uint64(len(local)) > uint64(len(mem))-off {
		return StatusRemoteAccess, fmt.Errorf("region of segment %d at offset %d outside its %d bytes", e.seg, e.segOff, len(mem))
	}
	remote := mem[off : off+uint64(len(local))]
	// Through the caches both ways: an RDMA Write's target may read none
	// of it (perftest's write_lat reads its last byte), and then a string
	// move (copyShared) costs more than it saves (docs/performance.md,
	// "Copies into shared memory").
	dst, src, way := local, remote, copyCached
	if op == OpWrite {
		dst, src = remote, local
	}
	if nt {
		way = copyNT
	}
	if qp.dev.owns(mr) {
		// Device memory and the peer's segment, which stays mapped while
		// we hold sqMu: neither can vanish.
		copyBy(dst, src, way)
	} else {
		err = safeCopyBy(dst, src, way)
	}
	if err != nil {
		return StatusLocalAccess, err
	}
	return StatusSuccess, nil
}

// A copyWay is how a copy stores: through the caches into memory this
// process reads next (copy), into memory the peer reads next
// (mem.CopyShared: no line read back from the peer's cache first), or
// around the caches (mem.CopyNT, when the caller measured it pays).
type copyWay uint8

const (
	copyCached copyWay = iota
	copyShared
	copyNT
)

// copyBy copies src to dst the given way.
func copyBy(dst, src []byte, way copyWay) {
	switch way {
	case copyShared:
		imem.CopyShared(dst, src)
	case copyNT:
		imem.CopyNT(dst, src)
	default:
		copy(dst, src)
	}
}

// safeCopy copies src to dst and turns a memory fault (a buffer that was
// unmapped under us) into an error instead of a crash.
func safeCopy(dst, src []byte) error { return safeCopyBy(dst, src, copyCached) }

// safeCopyBy is safeCopy the given way.
func safeCopyBy(dst, src []byte, way copyWay) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			re, ok := r.(runtime.Error)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("memory fault during copy: %w", re)
		}
	}()
	copyBy(dst, src, way)
	return nil
}

// segment returns the peer's memory segment idx, waiting for it: the
// peer announces a new segment on the connection socket, which can arrive
// after a key for memory in it arrived on the ring. The announcement is in
// the socket before the key can be (the peer's Alloc announces to every
// queue pair before it returns), so the wait is for our reader only, and
// a hang-up ends it; the bound is for a reader that is far behind, as
// with a thousand connections on a loaded machine (docs/performance.md).
const segmentWait = 10 * time.Second

// testHookSegmentWait, if set, sees a copy begin to wait for the
// announcement of the peer's segment idx.
var testHookSegmentWait atomic.Pointer[func(idx uint32)]

func (p *peerInfo) segment(idx uint32) (*shm.Segment, error) {
	if h := p.hot[idx%peerSegHot].Load(); h != nil && h.idx == idx {
		return h.seg, nil
	}
	// The common case, apart: a function with a defer in a loop pays for
	// the runtime's defer records on every call (docs/performance.md).
	p.segMu.Lock()
	seg := p.segs[idx]
	live := seg != nil && seg != deniedSegment
	if live {
		// A miss allocates: one per segment and slot, while copies go to
		// that segment (two segments on one slot take turns).
		p.hot[idx%peerSegHot].Store(&hotSeg{idx: idx, seg: seg})
	}
	p.segMu.Unlock()
	if live {
		return seg, nil
	}
	return p.awaitSegment(idx)
}

// awaitSegment is segment's wait for an announcement still on its way.
func (p *peerInfo) awaitSegment(idx uint32) (*shm.Segment, error) {
	timer := (*time.Timer)(nil)
	for {
		p.segMu.Lock()
		seg, changed := p.segs[idx], p.segChanged
		if seg != nil && seg != deniedSegment {
			p.hot[idx%peerSegHot].Store(&hotSeg{idx: idx, seg: seg}) // as segment does
		}
		p.segMu.Unlock()
		if seg == deniedSegment {
			return nil, fmt.Errorf("peer memory segment %d is not shared with our uid", idx)
		}
		if seg != nil {
			return seg, nil
		}
		if changed == nil {
			return nil, fmt.Errorf("peer memory segment %d unknown: connection gone", idx)
		}
		if timer == nil {
			timer = time.NewTimer(segmentWait)
			defer timer.Stop()
			if h := testHookSegmentWait.Load(); h != nil {
				(*h)(idx)
			}
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil, fmt.Errorf("peer memory segment %d never announced", idx)
		}
	}
}

// PostRecv posts a receive buffer.
func (qp *QueuePair) PostRecv(wr RecvWR) error {
	if qp.inPlace {
		return errInPlace
	}
	mr, err := qp.dev.localRegion(wr.LKey, wr.Buf, AccessLocalWrite)
	if err != nil {
		return err
	}
	qp.rqMu.Lock()
	if qp.State() != QPReady {
		qp.rqMu.Unlock()
		return qp.stateErr()
	}
	if len(qp.rq)-qp.rqHead >= qp.dev.cfg.RecvDepth {
		qp.rqMu.Unlock()
		return ErrQueueFull
	}
	// Records wait in the ring for a receive only while none is posted:
	// then this one may take one now. Otherwise the next poll does, and a
	// waiter's poll takes them — polling the ring here
	// would only read the line the peer is about to write.
	starved := qp.rqHead == len(qp.rq)
	qp.rq = append(qp.rq, postedRecv{wr, mr})
	if starved {
		qp.rqAny.Store(true)
		qp.progressRecvLocked(nil)
		return nil
	}
	qp.rqMu.Unlock()
	return nil
}

// compactRQ drops consumed receives from the front of rq once they are
// half of it, so that a queue that always has receives posted does not
// grow without bound. The caller holds rqMu.
func (qp *QueuePair) compactRQ() {
	switch {
	case qp.rqHead == 0:
	case qp.rqHead == len(qp.rq):
		// Consumed receives are zeroed as they complete.
		qp.rq, qp.rqHead = qp.rq[:0], 0
	case qp.rqHead >= 32 && 2*qp.rqHead >= len(qp.rq):
		n := copy(qp.rq, qp.rq[qp.rqHead:])
		clear(qp.rq[n:])
		qp.rq, qp.rqHead = qp.rq[:n], 0
	}
}

// recvPending tells whether a receive is posted and the incoming ring has
// something for it (a record, a close, a failure). It reads the
// consumer's position, which progressRecv moves: under rqMu.
func (qp *QueuePair) recvPending() bool {
	qp.rqMu.Lock()
	defer qp.rqMu.Unlock()
	return !qp.closed && qp.rqAny.Load() && qp.in.Pending()
}

// releaseLazy gives back the ring space that pollers' lazy releases held
// (see progressRecvLocked): a waiter does it before it sleeps.
func (qp *QueuePair) releaseLazy() {
	if qp.inPlace {
		return // the owner's ring to release
	}
	qp.rqMu.Lock()
	if !qp.closed {
		qp.in.Release()
	}
	qp.rqMu.Unlock()
}

// progressRecv moves incoming sends into posted receives and completes
// them on the receive CQ.
func (qp *QueuePair) progressRecv() { qp.progressRecvInto(nil) }

// progressRecvInto is progressRecv that hands completions straight to out
// while no completion is queued on the receive CQ (so none of this queue
// pair's can be ahead of them), queuing the rest; it returns how many it
// put in out. A poller then takes its completions without the CQ's lock.
func (qp *QueuePair) progressRecvInto(out []Completion) int {
	if !qp.rqAny.Load() {
		return 0
	}
	qp.rqMu.Lock()
	return qp.progressRecvLocked(out)
}

// progressRecvLocked is progressRecvInto with rqMu held; it unlocks rqMu.
func (qp *QueuePair) progressRecvLocked(out []Completion) int {
	var failure error
	direct := 0
	for !qp.closed && qp.rqHead < len(qp.rq) {
		if len(out) > 0 && direct == len(out) {
			break // the poller has what it asked for
		}
		rec, ok, err := qp.in.Poll()
		if err != nil {
			if errors.Is(err, shm.ErrClosed) {
				err = ErrPeerGone
			}
			failure = err
			break
		}
		if !ok {
			break
		}
		if rec.Tag == tagNop {
			qp.in.Release()
			continue
		}
		if rec.Tag != tagSend {
			failure = fmt.Errorf("%w: record tag %d on the ring", ErrProtocol, rec.Tag)
			break
		}
		r := &qp.rq[qp.rqHead]
		qp.rqHead++
		if qp.rqHead == len(qp.rq) {
			qp.rqAny.Store(false)
		}
		// Straight to the poller while nothing is queued ahead of it.
		toOut := direct < len(out) && !qp.recvCQ.pending()
		var c *Completion
		if toOut {
			c = &out[direct]
			direct++
		} else {
			c = new(Completion)
		}
		qp.deliver(c, r, rec.Data)
		traceRecvDone(qp, r.ID, c.Bytes, c.Status)
		*r = postedRecv{}
		qp.rstats.Recvs++
		qp.rstats.BytesReceived += uint64(c.Bytes)
		if c.Status != StatusSuccess {
			qp.rstats.Errors++
		}
		if !toOut {
			qp.recvCQ.push(c)
		}
		if c.Status != StatusSuccess {
			failure = c.Err()
			break
		}
	}
	// Give the ring space back — except a little when the poller got all
	// it asked for: its next progress (a poll, a PostRecv, or a waiter
	// before it sleeps) releases it, after the poller's reply is on its
	// way. Releasing is a locked store; on a ping-pong's path it is one
	// of the few things this layer adds to a raw ring's round trip.
	if !qp.closed && (direct == 0 || direct < len(out) || qp.in.Unreleased() > lazyRelease) {
		qp.in.Release()
	}
	qp.compactRQ()
	qp.rqMu.Unlock()
	if failure != nil && qp.setError(failure) {
		qp.flush()
	}
	return direct
}

// deliver completes the posted receive r with the incoming send data into
// c: it copies data into r's buffer unless the buffer is too small or its
// region was deregistered since the post (the memory may be unmapped, and
// its addresses mapped again by something else, where a copy would not
// fault). The caller holds rqMu.
func (qp *QueuePair) deliver(c *Completion, r *postedRecv, data []byte) {
	*c = Completion{ID: r.ID, Op: OpRecv, QP: qp, Bytes: len(data)}
	switch {
	case len(data) > len(r.Buf):
		c.Status, c.Bytes = StatusLocalLength, 0
		c.Reason = fmt.Errorf("message of %d bytes, buffer of %d", len(data), len(r.Buf))
	case r.mr != nil && qp.dev.regs[r.mr.idx].Load() != r.mr:
		c.Status, c.Bytes = StatusLocalAccess, 0
		c.Reason = fmt.Errorf("receive buffer's region was deregistered")
	case qp.dev.owns(r.mr):
		copy(r.Buf, data) // device memory to ring: neither can vanish
	default:
		if err := safeCopy(r.Buf, data); err != nil {
			c.Status, c.Bytes, c.Reason = StatusLocalAccess, 0, err
		}
	}
}

// lazyRelease bounds the ring space a poller's receives may hold after it
// returns: small next to any ring, so a sender never waits for it long.
const lazyRelease = 4 << 10

// setError moves the queue pair to the error state with reason and tells
// whether this call did it (then the caller must flush once it holds no
// locks). It wakes this process's waiters on the rings.
func (qp *QueuePair) setError(reason error) bool {
	for {
		s := qp.state.Load()
		if s == uint32(QPError) {
			return false
		}
		if qp.state.CompareAndSwap(s, uint32(QPError)) {
			break
		}
	}
	qp.reason.Store(&reason)
	if !qp.inPlace {
		// An in-place ring's owner takes what came before the failure
		// first (RecvInPlace); flush wakes it.
		qp.in.Fail(reason)
	}
	qp.out.Fail(reason)
	return true
}

// flush completes every queued work request with StatusFlushed. The caller
// holds no locks.
func (qp *QueuePair) flush() {
	reason := qp.Err()
	qp.sqMu.Lock()
	ops := qp.sq
	qp.sq = nil
	qp.sqLen.Store(0)
	for _, op := range ops {
		qp.sendCQ.push(&Completion{ID: op.wr.ID, Op: op.wr.Op, Status: StatusFlushed, Bytes: op.done, QP: qp, Reason: reason})
	}
	qp.rqMu.Lock()
	recvs := qp.rq[qp.rqHead:]
	for _, r := range recvs {
		qp.recvCQ.push(&Completion{ID: r.ID, Op: OpRecv, Status: StatusFlushed, QP: qp, Reason: reason})
	}
	qp.rqAny.Store(false)
	qp.rq, qp.rqHead = nil, 0
	qp.rqMu.Unlock()
	qp.sqMu.Unlock()
	qp.sendCQ.wakeWaiter()
	qp.recvCQ.wakeWaiter()
}

// pollerNear tells whether a poller began or ended a turn of queued work
// within engineYield.
func (qp *QueuePair) pollerNear() bool {
	at := qp.polledAt.Load()
	return at != 0 && time.Since(clockBase)-time.Duration(at) < engineYield
}

// clockBase is the origin of polledAt's monotonic times.
var clockBase = time.Now()

// engineTurn runs one chunk of the first queued op, for a poller of the
// send CQ or (byPoller false) for the engine. It reports whether the queue
// pair has more work, and whether the engine's turn was left to pollers
// that ran one within engineYield (then nothing ran).
func (qp *QueuePair) engineTurn(byPoller bool) (more, yielded bool) {
	if byPoller {
		qp.polledAt.Store(int64(time.Since(clockBase)))
	} else if qp.pollerNear() {
		return true, true // still queued: the engine looks again later
	}
	qp.sqMu.Lock()
	if !byPoller && qp.pollerNear() {
		// A poller's turn ended while we waited for the lock.
		qp.sqMu.Unlock()
		return true, true
	}
	if qp.closed || len(qp.sq) == 0 || qp.State() != QPReady {
		qp.queued = false
		flush := !qp.closed && len(qp.sq) > 0
		qp.sqMu.Unlock()
		if flush {
			qp.flush()
		}
		return false, false
	}
	op := qp.sq[0]
	if byPoller {
		qp.sstats.PolledChunks++
	} else {
		qp.sstats.EngineChunks++
	}
	var wait time.Time
	if op.wr.Op == OpSend {
		wait = time.Now().Add(200 * time.Microsecond)
	}
	st, reason, finished := qp.execute(op, qp.dev.cfg.Chunk, wait)
	if !finished && op.wr.Op == OpSend {
		qp.sstats.RNRRetries++
		// The timeout runs while the peer consumes nothing at all.
		if head := qp.out.Released(); op.rnrSince.IsZero() || head != op.rnrHead {
			op.rnrSince, op.rnrHead = time.Now(), head
		} else if time.Since(op.rnrSince) > qp.dev.cfg.RNRTimeout {
			st, reason, finished = StatusRNRRetryExceeded, fmt.Errorf("peer consumed nothing for %v", qp.dev.cfg.RNRTimeout), true
		}
	}
	failed := false
	if finished {
		qp.sstats.EngineExecs++
		qp.sq[0] = nil
		qp.sq = qp.sq[1:]
		qp.sqLen.Store(int32(len(qp.sq)))
		failed = qp.finish(op, st, reason)
	}
	more = len(qp.sq) > 0 && !failed
	if !more {
		qp.queued = false
	}
	if byPoller {
		// Before the unlock: an engine waiting for the lock sees it.
		qp.polledAt.Store(int64(time.Since(clockBase)))
	}
	qp.sqMu.Unlock()
	if failed {
		qp.flush()
	}
	return more, false
}

// releaseSegment lets go of the queue pair's segment, which nothing of
// ours touches any more: pooled for the dialer's next queue pair to the
// same process, marked free and parked by the acceptor, else unmapped.
func (qp *QueuePair) releaseSegment() {
	switch {
	case qp.poolKey != nil:
		qp.dev.poolQP(qp.seg, *qp.poolKey, qp.segCap)
	case qp.segImported:
		freeQPImport(qp.seg, qp.dev)
	default:
		qp.seg.Close()
	}
}

// Close moves the queue pair to the error state, flushes its work, tells
// the peer, and releases its shared memory. It waits for the engine and
// for waiters on its completion queues to let go of the mappings.
func (qp *QueuePair) Close() error {
	qp.closeOnce.Do(func() {
		if qp.setError(ErrClosed) {
			qp.flush()
		}
		qp.out.Close() // the peer's reads end with ErrClosed after the last record
		qp.conn.Close()
		if qp.started.Load() {
			<-qp.readerDone
		}
		qp.recvCQ.detach(qp)
		qp.sendCQ.detachSend(qp)
		qp.sqMu.Lock()
		qp.rqMu.Lock()
		qp.closed = true
		qp.rqMu.Unlock()
		qp.sqMu.Unlock()
		qp.awaitRetired() // the reader, which starts them, is done
		qp.releaseSegment()
		// The peer's hub, table and segments stay mapped a while for the
		// device's next queue pairs (imports.go).
		parkNotifier(qp.note, qp.dev)
		parkImport(qp.peer.tableSeg, qp.dev)
		qp.peer.segMu.Lock()
		for idx, s := range qp.peer.segs {
			qp.peer.unhotLocked(idx)
			parkImport(s, qp.dev)
		}
		qp.peer.segs = nil
		qp.peer.segMu.Unlock()
		st := qp.Stats()
		qp.dev.mu.Lock()
		if _, ok := qp.dev.qps[qp]; ok {
			delete(qp.dev.qps, qp)
			qp.dev.retired.add(&st)
		}
		qp.dev.mu.Unlock()
	})
	return nil
}
