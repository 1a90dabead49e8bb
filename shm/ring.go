package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/sys"
)

// InitRing lays out a fresh ring with a data area of capacity bytes in
// region, which must be 128-byte aligned and at least RingSize(capacity)
// long. Only the ring's creator calls it, before any peer attaches.
func InitRing(region []byte, capacity int) error {
	if err := checkRingRegion(region, capacity); err != nil {
		return err
	}
	clear(region[:RingSize(capacity)])
	writeRingHeader(region, capacity)
	return nil
}

// InitZeroedRing is InitRing for a region that is all zero already — fresh
// pages of a new segment (CreateSegment): it writes the header alone and
// leaves the data area's pages untouched, so that they take memory only
// once records reach them (a connection's rings are mostly idle: clearing
// both faulted in 128 KiB a connection that nothing else touched).
func InitZeroedRing(region []byte, capacity int) error {
	if err := checkRingRegion(region, capacity); err != nil {
		return err
	}
	writeRingHeader(region, capacity)
	return nil
}

// ResetRing makes a ring that was used, and that neither side uses any
// more, an empty one again, as InitZeroedRing leaves a fresh one: its
// header lines (positions, doorbells, the closed flags) zeroed and
// written, and the first record slot of its data area zeroed. The rest of
// the data area keeps the old records and needs no clearing: a consumer
// reads only the slot at its position, and the producer zeroes the slot
// after each record before it commits the record, so no consumer ever
// reaches a slot the producer has not written since the reset. Pages the
// old records touched stay in memory, the point of reusing a ring.
func ResetRing(region []byte, capacity int) error {
	if err := checkRingRegion(region, capacity); err != nil {
		return err
	}
	clear(region[:RingHeaderSize])
	store64(word64(region, RingHeaderSize), 0)
	writeRingHeader(region, capacity)
	return nil
}

func checkRingRegion(region []byte, capacity int) error {
	if capacity < MinRingCapacity || capacity > MaxRingCapacity || capacity&(capacity-1) != 0 {
		return fmt.Errorf("shm: ring capacity %d is not a power of two in [%d, %d]", capacity, MinRingCapacity, MaxRingCapacity)
	}
	if len(region) < RingSize(capacity) {
		return fmt.Errorf("shm: ring region of %d bytes, need %d", len(region), RingSize(capacity))
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(region)))%lineSize != 0 {
		return fmt.Errorf("shm: ring region not %d-byte aligned", lineSize)
	}
	return nil
}

func writeRingHeader(region []byte, capacity int) {
	store32(word32(region, ringMagicOff), ringMagic)
	store32(word32(region, ringVersionOff), ringVersion)
	store64(word64(region, ringCapacityOff), uint64(capacity))
}

// ring is what both sides share: the validated geometry, private copies of
// everything, and pointers to the shared words.
type ring struct {
	data     unsafe.Pointer // start of the data area
	dataMem  []byte         // the data area, for slicing payloads
	capacity uint64
	mask     uint64
	maxPay   int

	tail    *uint64 // producer line
	head    *uint64 // consumer line
	pClosed *uint32 // control line
	cClosed *uint32 // control line
	cSpins  *uint32 // control line: the consumer never sleeps (SetSpinning)
	pFences *uint32 // control line: the producer fences for unfenced releases (NewProducer)
	cBell   *uint32 // consumer doorbell
	pBell   *uint32 // producer doorbell

	wait   WaitStrategy
	waiter *Waiter               // this side parks here; nil: it naps
	peer   *Notifier             // wakes the peer's waiters; nil: none
	err    atomic.Pointer[error] // set once: the side failed or closed
}

func (r *ring) attach(region []byte, cfg WaitConfig) error {
	cfg = cfg.orDefault()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(region) < RingHeaderSize+MinRingCapacity {
		return fmt.Errorf("%w: ring region of %d bytes is too small", ErrCorrupt, len(region))
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(region)))%lineSize != 0 {
		return fmt.Errorf("shm: ring region not %d-byte aligned", lineSize)
	}
	magic := load32(word32(region, ringMagicOff))
	version := load32(word32(region, ringVersionOff))
	capacity := load64(word64(region, ringCapacityOff))
	switch {
	case magic != ringMagic:
		return fmt.Errorf("%w: ring magic %#x", ErrCorrupt, magic)
	case version != ringVersion:
		return fmt.Errorf("%w: ring version %d, want %d", ErrCorrupt, version, ringVersion)
	case capacity < MinRingCapacity || capacity > MaxRingCapacity || capacity&(capacity-1) != 0:
		return fmt.Errorf("%w: ring capacity %d", ErrCorrupt, capacity)
	case uint64(len(region)-RingHeaderSize) < capacity:
		return fmt.Errorf("%w: ring capacity %d exceeds its region of %d bytes", ErrCorrupt, capacity, len(region))
	}
	r.dataMem = region[RingHeaderSize : RingHeaderSize+int(capacity) : RingHeaderSize+int(capacity)]
	r.data = unsafe.Pointer(unsafe.SliceData(r.dataMem))
	r.capacity = capacity
	r.mask = capacity - 1
	r.maxPay = maxPayload(int(capacity))
	r.tail = word64(region, ringTailOff)
	r.head = word64(region, ringHeadOff)
	r.pClosed = word32(region, ringPClosedOff)
	r.cClosed = word32(region, ringCClosedOff)
	r.cSpins = word32(region, ringCSpinsOff)
	r.pFences = word32(region, ringPFencesOff)
	r.cBell = word32(region, ringConsumerBell)
	r.pBell = word32(region, ringProducerBell)
	r.wait = NewWaitStrategy(cfg)
	return nil
}

// MaxPayload is the largest record payload the ring accepts.
func (r *ring) MaxPayload() int { return r.maxPay }

// Capacity is the size of the ring's data area.
func (r *ring) Capacity() int { return int(r.capacity) }

func (r *ring) failed() error {
	if p := r.err.Load(); p != nil {
		return *p
	}
	return nil
}

// setErr records err as the side's permanent state (the first one wins) and
// wakes this process's waiter on either doorbell so it sees it.
func (r *ring) setErr(err error) error {
	if !r.err.CompareAndSwap(nil, &err) {
		return r.failed()
	}
	// Publish the failure (above), then wake this side's waiter: its
	// re-check after the announcement sees it.
	if r.waiter != nil {
		r.waiter.Wake()
	}
	return err
}

// Fail makes every later call on this side return err, and wakes a call of
// this side that is waiting. Upper layers call it when they learn that the
// peer died. It may be called from any goroutine.
func (r *ring) Fail(err error) {
	if err == nil {
		err = ErrClosed
	}
	r.setErr(err)
}

// SetWake gives the side the Waiter it parks on when it sleeps (nil: it
// naps instead, polling) and the Notifier that wakes its peer's waiters
// (nil: the peer is never woken, so it must not park: it spins or naps).
// Call it before the side is used.
func (r *ring) SetWake(w *Waiter, peer *Notifier) { r.waiter, r.peer = w, peer }

// wake wakes the peer parked on bell if it announced that it sleeps.
func (r *ring) wake(bell *uint32, wakes *uint64) {
	// Load first: the common case is no sleeper, and a plain load keeps the
	// doorbell line shared instead of pulling it over exclusively.
	if load32(bell) == 0 {
		return
	}
	if v := swap32(bell, 0); v != 0 && r.peer != nil {
		r.peer.Notify(v - 1)
		*wakes++
	}
}

// Producer is the writing side of a ring. It is not safe for concurrent use:
// one goroutine writes at a time. Fail, Close and Stats' caller rules are as
// documented on them.
type Producer struct {
	ring
	tailPos   uint64 // next record position (private)
	fenceFree bool   // a consumer's global barrier reaches this process (sys.MembarrierRegister)
	watch     bool   // the registration was under way at the last look (noteBarriers)
	headCache uint64 // consumer's head as last loaded and validated
	resvSize  uint64 // record bytes reserved by Reserve, 0 if none
	resvPay   int    // payload bytes reserved
	stats     WaitStats
	need      uint64 // what waitSpace waits for
	waitErr   error  // why it stopped
}

// NewProducer attaches to the ring in region as its producer.
func NewProducer(region []byte, cfg WaitConfig) (*Producer, error) {
	p := &Producer{}
	if err := p.attach(region, cfg); err != nil {
		return nil, err
	}
	head, tail := load64(p.head), load64(p.tail)
	if head > tail || tail-head > p.capacity || tail%recAlign != 0 {
		return nil, fmt.Errorf("%w: ring positions head %d tail %d", ErrCorrupt, head, tail)
	}
	p.tailPos, p.headCache = tail, head
	// Registered, this process is reached by a consumer's global barrier:
	// its commits may skip their fence while the consumer spins. And it
	// can issue one: the consumer may release records without a fence,
	// since this producer issues the barrier before it sleeps for space
	// (spaceWait.Arm). The registration runs in the background (it takes
	// milliseconds): until it is through, commits fence, and the first
	// commit after it takes the fence-free way (noteBarriers).
	sys.MembarrierStart()
	p.watch = true
	p.noteBarriers()
	return p, nil
}

// barrierState is sys.MembarrierState; tests replace it to hold a ring
// in the time before the registration is through.
var barrierState = sys.MembarrierState

// noteBarriers looks at the process's registration for global barriers,
// which was under way at the last look (watch), and takes the fence-free
// ways once it is through: from then on, this producer issues a global
// barrier before it sleeps for space (spaceWait.Arm, on this goroutine,
// so it sees fenceFree set before any consumer sees pFences), and says
// so to the consumer.
func (p *Producer) noteBarriers() {
	switch barrierState() {
	case sys.MembarrierReady:
		p.watch = false
		p.fenceFree = true
		store32(p.pFences, 1) // publishes: releases may skip their fence
	case sys.MembarrierFailed:
		p.watch = false
	}
}

// Released returns the consumer's position as this producer last loaded
// it: how far the consumer has released records. It only grows.
func (p *Producer) Released() uint64 { return p.headCache }

// Stats returns the producer's wait counters. Call it from the goroutine
// that writes, or after writing has stopped.
func (p *Producer) Stats() WaitStats { return p.stats }

// Reserve returns a slice of n bytes inside the ring for the next record,
// waiting for space as configured, at most until deadline (zero: no
// deadline). Fill it, then Commit. The slice is shared memory: the consumer
// can read it once committed.
func (p *Producer) Reserve(n int, deadline time.Time) ([]byte, error) {
	if err := p.failed(); err != nil {
		return nil, err
	}
	if n < 0 || n > p.maxPay {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, n, p.maxPay)
	}
	if p.resvSize != 0 {
		return nil, errors.New("shm: Reserve while a reservation is pending")
	}
	if load32(p.cClosed) != 0 {
		return nil, p.setErr(ErrClosed)
	}
	size := uint64(recordSize(n))
	off := p.tailPos & p.mask
	need := size + recHeaderSize // the record and the zeroed slot after it
	pad := uint64(0)
	if off+size > p.capacity {
		pad = p.capacity - off
		need += pad
	}
	if p.capacity-(p.tailPos-p.headCache) < need {
		if err := p.waitSpace(need, deadline); err != nil {
			return nil, err
		}
	}
	if pad != 0 {
		// The slot after the padding is the start of the area: zero it,
		// then commit the padding record.
		*at(p.data, 0) = 0
		store64(at(p.data, off), hdrCommitted|hdrPadding|(pad-recHeaderSize))
		p.tailPos += pad
		off = 0
	}
	p.resvSize, p.resvPay = size, n
	start := int(off) + recHeaderSize
	return p.dataMem[start : start+n : start+n], nil
}

// Commit publishes the reserved record with its first n bytes (n at most
// what was reserved) and the given tag, and wakes the consumer if it sleeps.
func (p *Producer) Commit(tag uint16, n int) error {
	if p.resvSize == 0 {
		return errors.New("shm: Commit without Reserve")
	}
	if n < 0 || n > p.resvPay {
		return fmt.Errorf("shm: Commit of %d bytes, %d reserved", n, p.resvPay)
	}
	size := uint64(recordSize(n))
	// The slot after the record lies in reserved space: zero it first, so
	// the consumer finds "nothing yet" there once it has read this record.
	*at(p.data, (p.tailPos+size)&p.mask) = 0
	hdr, h := at(p.data, p.tailPos&p.mask), hdrCommitted|uint64(tag)<<hdrTagShift|uint64(n)
	if p.fenceFree && load32(p.cSpins) != 0 {
		// Publishes the record: header last, a release store. The
		// consumer never sleeps, so no doorbell check below needs the
		// store ordered before its load, and a sequentially consistent
		// store would wait until every store of the record had reached
		// the consumer's core (docs/performance.md, "Commits without a
		// fence"). A consumer that comes to sleep takes its word back
		// and fences for us (Consumer.armBell).
		storeRelease64(hdr, h)
	} else {
		// Publishes the record: header last, sequentially consistent:
		// the doorbell check below must not pass it.
		store64(hdr, h)
		if p.watch {
			p.noteBarriers()
		}
	}
	p.tailPos += size
	p.resvSize = 0
	// For observers (statistics) only; no side reads it to make progress.
	*p.tail = p.tailPos
	p.wake(p.cBell, &p.stats.Wakes)
	return nil
}

// Write copies b into the ring as one record with the given tag.
func (p *Producer) Write(tag uint16, b []byte, deadline time.Time) error {
	buf, err := p.Reserve(len(b), deadline)
	if err != nil {
		return err
	}
	mem.CopyShared(buf, b) // the consumer reads it next
	return p.Commit(tag, len(b))
}

// refreshHead loads the consumer's head once and validates it: it only
// grows and never passes the tail.
func (p *Producer) refreshHead() error {
	h := load64(p.head)
	if h < p.headCache || h > p.tailPos {
		return p.setErr(fmt.Errorf("%w: consumer head %d outside [%d, %d]", ErrCorrupt, h, p.headCache, p.tailPos))
	}
	p.headCache = h
	return nil
}

func (p *Producer) hasSpace(need uint64) bool {
	return p.capacity-(p.tailPos-p.headCache) >= need
}

// check is the slow-path test of everything that ends a wait for space.
func (p *Producer) check(need uint64) (bool, error) {
	if err := p.failed(); err != nil {
		return false, err
	}
	if err := p.refreshHead(); err != nil {
		return false, err
	}
	if p.hasSpace(need) {
		return true, nil
	}
	if load32(p.cClosed) != 0 {
		return false, p.setErr(ErrClosed)
	}
	return false, nil
}

func (p *Producer) waitSpace(need uint64, deadline time.Time) error {
	p.need, p.waitErr = need, nil
	out, err := p.wait.Wait((*spaceWait)(p), p.waiter, deadline)
	p.stats.count(out)
	if err != nil {
		return err
	}
	return p.waitErr
}

// spaceWait is a Producer waiting for room for need bytes.
type spaceWait Producer

func (w *spaceWait) Ready() bool {
	p := (*Producer)(w)
	if load64(p.head) == p.headCache && p.err.Load() == nil && load32(p.cClosed) == 0 {
		return false
	}
	ok, err := p.check(p.need)
	p.waitErr = err
	return ok || err != nil
}

// Arm announces bell in the producer's doorbell. A producer that
// declared it fences for the consumer (pFences) then issues a global
// barrier, before the caller re-checks the head: a release published with
// a release store before the barrier is visible after it, and a release
// after it sees the doorbell, so no wake-up is lost either way
// (Consumer.publishHead).
func (w *spaceWait) Arm(bell uint32) {
	store32(w.pBell, bell) // publishes: wake this waiter
	if bell != 0 && w.fenceFree {
		_ = sys.MembarrierGlobal() // NewProducer's registration checked that it works
	}
}

func (s *WaitStats) count(o Outcome) {
	switch o {
	case WaitedReady:
		s.Ready++
	case WaitedSpun:
		s.Spun++
	default:
		s.Slept++
	}
}

// Close tells the consumer that no more records come, wakes it, and makes
// later calls on this side return ErrClosed. Records already committed stay
// readable. It may be called from any goroutine.
func (p *Producer) Close() error {
	store32(p.pClosed, 1) // publishes: no record follows the last commit
	var wakes uint64
	p.wake(p.cBell, &wakes)
	p.setErr(ErrClosed)
	return nil
}

// Record is one record read from a ring. Data aliases shared memory that
// the producer wrote: it is valid until the consumer's next Release, and
// its contents are untrusted (copy before validating what must not change).
type Record struct {
	Tag  uint16
	Data []byte
}

// Consumer is the reading side of a ring. It is not safe for concurrent
// use: one goroutine reads at a time. Fail and Close may be called from any
// goroutine.
type Consumer struct {
	ring
	headPos  uint64 // next record position (private)
	released uint64 // head as last published
	unfenced bool   // a producer's global barrier reaches this process (sys.MembarrierRegister)
	watch    bool   // the registration was under way at the last look (noteBarriers)
	spinDue  bool   // SetSpinning's declaration, made once the registration is through
	stats    WaitStats
	got      Record // what Next's wait found
	gotErr   error
}

// NewConsumer attaches to the ring in region as its consumer.
func NewConsumer(region []byte, cfg WaitConfig) (*Consumer, error) {
	c := &Consumer{}
	if err := c.attach(region, cfg); err != nil {
		return nil, err
	}
	head := load64(c.head)
	if head%recAlign != 0 {
		return nil, fmt.Errorf("%w: ring head %d", ErrCorrupt, head)
	}
	c.headPos, c.released = head, head
	// In the background, as for the producer: releases fence until the
	// registration is through.
	sys.MembarrierStart()
	c.watch = true
	c.noteBarriers()
	return c, nil
}

// noteBarriers looks at the process's registration for global barriers,
// which was under way at the last look (watch): once it is through, the
// producer's barriers reach this process, and releases may skip their
// fence when the producer says it issues them (publishHead).
func (c *Consumer) noteBarriers() {
	switch barrierState() {
	case sys.MembarrierReady:
		c.watch = false
		c.unfenced = true
		if c.spinDue {
			c.spinDue = false
			store32(c.cSpins, 1) // SetSpinning's declaration
		}
	case sys.MembarrierFailed:
		c.watch, c.spinDue = false, false
	}
}

// Stats returns the consumer's wait counters. Call it from the goroutine
// that reads, or after reading has stopped.
func (c *Consumer) Stats() WaitStats { return c.stats }

func (c *Consumer) corrupt(format string, args ...any) error {
	return c.setErr(fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...))
}

// Poll returns the next record if one is committed, without waiting. It
// returns ok == false when the ring is empty, and ErrClosed once the
// producer has closed and every record has been read.
func (c *Consumer) Poll() (rec Record, ok bool, err error) {
	if err := c.failed(); err != nil {
		return Record{}, false, err
	}
	for {
		off := c.headPos & c.mask
		h := load64(at(c.data, off)) // observes the producer's commit
		if h == 0 {
			if load32(c.pClosed) == 0 {
				return Record{}, false, nil
			}
			// Closed is stored after the last commit: look once more.
			if load64(at(c.data, off)) == 0 {
				return Record{}, false, c.setErr(ErrClosed)
			}
			continue
		}
		if h&hdrCommitted == 0 || h&hdrReserved != 0 {
			return Record{}, false, c.corrupt("record header %#x at %d", h, c.headPos)
		}
		n := h & hdrLenMask
		var size uint64
		if h&hdrPadding != 0 {
			if off+recHeaderSize+n != c.capacity {
				return Record{}, false, c.corrupt("padding of %d bytes at offset %d", n, off)
			}
			size = c.capacity - off
		} else {
			if n > uint64(c.maxPay) || off+recHeaderSize+n > c.capacity {
				return Record{}, false, c.corrupt("record of %d bytes at offset %d", n, off)
			}
			size = uint64(recordSize(int(n)))
		}
		// The producer keeps an 8-byte gap: no record reaches into what we
		// have not released.
		if c.headPos+size-c.released > c.capacity-recHeaderSize {
			return Record{}, false, c.corrupt("record at %d overruns unreleased space from %d", c.headPos, c.released)
		}
		c.headPos += size
		if h&hdrPadding != 0 {
			continue
		}
		start := off + recHeaderSize
		return Record{Tag: uint16(h >> hdrTagShift), Data: c.dataMem[start : start+n : start+n]}, true, nil
	}
}

// Next returns the next record, waiting as configured, at most until
// deadline (zero: no deadline; then os.ErrDeadlineExceeded).
func (c *Consumer) Next(deadline time.Time) (Record, error) {
	rec, ok, err := c.Poll()
	if ok || err != nil {
		if ok {
			c.stats.Ready++
		}
		return rec, err
	}
	c.got, c.gotErr = Record{}, nil
	out, err := c.wait.Wait((*nextWait)(c), c.waiter, deadline)
	c.got.Data = c.got.Data[:len(c.got.Data):len(c.got.Data)]
	c.stats.count(out)
	if err != nil {
		return Record{}, err
	}
	return c.got, c.gotErr
}

// nextWait is a Consumer waiting for a record.
type nextWait Consumer

func (w *nextWait) Ready() bool {
	c := (*Consumer)(w)
	if !c.Pending() {
		return false
	}
	rec, ok, err := c.Poll()
	c.got, c.gotErr = rec, err
	return ok || err != nil
}

func (w *nextWait) Arm(bell uint32) { (*Consumer)(w).armBell(bell) }

// SetSpinning declares that this consumer waits by spinning only (busy
// polling) and does not sleep: the producer may then publish records with
// release stores instead of sequentially consistent ones, which wait for
// every store of the record to reach this core (docs/performance.md,
// "Commits without a fence"). A wait that parks all the same takes the
// declaration back first, at the cost of one global memory barrier
// (armBell). It needs membarrier(2)'s global expedited barriers; without
// them it says why, and the producer fences every commit as before.
//
// While the process's registration for those barriers is under way (it
// runs in the background: sys.MembarrierStart), the declaration waits for
// it: the first release after it is through makes it (noteBarriers).
func (c *Consumer) SetSpinning() error {
	switch barrierState() {
	case sys.MembarrierPending: // under way: NewConsumer started it
		c.spinDue = true
		c.watch = true
		return nil
	case sys.MembarrierFailed:
		return sys.MembarrierRegister() // its reason
	}
	store32(c.cSpins, 1) // publishes: commits may skip their fence
	return nil
}

// armBell announces bell (a Waiter's slot + 1; 0: none) in the consumer's
// doorbell: the producer wakes it after its next commit. A consumer whose
// word says it spins (SetSpinning declared it; or the peer scribbled on
// it) takes that back and fences on the producer's behalf, after both stores
// and before the caller re-checks the ring: a commit published with a
// release store before the barrier is visible after it, and one after
// it sees the doorbell (its producer's barrier came between its store and
// its doorbell check), so no wake-up is lost either way.
func (c *Consumer) armBell(bell uint32) {
	store32(c.cBell, bell) // publishes: wake this waiter
	if bell != 0 {
		c.spinDue = false // a declaration not made yet is taken back too
	}
	if bell == 0 || load32(c.cSpins) == 0 {
		return
	}
	store32(c.cSpins, 0) // publishes: every commit fences from here on
	// SetSpinning checked that the barrier works. A scribbled word
	// without it leaves the producer's release stores, which reach this
	// core within a moment: the wait's re-checks and deadlines bound that.
	_ = sys.MembarrierGlobal()
}

// Position returns the ring position after the last record returned: a
// point to release up to (ReleaseTo). Positions only grow.
func (c *Consumer) Position() uint64 { return c.headPos }

// ReleaseTo is Release of the records returned before position pos only,
// a value Position returned; the records after it stay valid. A position
// already released, or not reached, releases nothing.
func (c *Consumer) ReleaseTo(pos uint64) {
	if pos <= c.released || pos > c.headPos {
		return
	}
	c.publishHead(pos)
}

// publishHead publishes pos as the consumer's head, the space before it
// free, and wakes a producer that sleeps for space. The store is a
// sequentially consistent one, so that the doorbell's load cannot pass
// it, unless this process is reached by the producer's global barrier
// and the producer said it issues one before it sleeps (pFences,
// spaceWait.Arm): then a release store, which costs no fence on the
// path of every Read (docs/performance.md, "Releases without a fence").
func (c *Consumer) publishHead(pos uint64) {
	if c.unfenced && load32(c.pFences) != 0 {
		storeRelease64(c.head, pos)
	} else {
		store64(c.head, pos)
		if c.watch {
			c.noteBarriers()
		}
	}
	c.released = pos
	c.wake(c.pBell, &c.stats.Wakes)
}

// Unreleased returns the bytes of records returned so far and not yet
// released.
func (c *Consumer) Unreleased() int { return int(c.headPos - c.released) }

// Release gives the space of every record returned so far back to the
// producer (their Data slices become invalid) and wakes the producer if it
// waits for space. Releasing once per batch is cheaper than per record.
func (c *Consumer) Release() {
	if c.headPos == c.released {
		return
	}
	c.publishHead(c.headPos)
}

// Close tells the producer that nothing more is read, wakes it, and makes
// later calls on this side return ErrClosed. It may be called from any
// goroutine.
func (c *Consumer) Close() error {
	store32(c.cClosed, 1) // publishes: the consumer reads no more
	var wakes uint64
	c.wake(c.pBell, &wakes)
	c.setErr(ErrClosed)
	return nil
}
