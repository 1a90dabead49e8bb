package shm

import (
	"fmt"
	"math/bits"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
)

// A Hub is how goroutines of this process sleep until a peer process, or
// code of this process, wakes them, without holding an OS thread: each
// waiting goroutine parks on a Go channel (a Waiter), and one dispatcher
// goroutine per hub parks in the runtime's netpoller on a pipe. A peer
// wakes a waiter by its slot number: it marks the slot in the hub's shared
// table and writes a byte to the pipe only when the dispatcher announced
// that it is parked (Notifier.Notify); the dispatcher then readies every
// marked slot's goroutine, which runs on the dispatcher's thread next. So a
// process holds one pipe for any number of waiting goroutines, a peer
// holds one descriptor per hub it wakes, and a wake-up costs a write, a
// read and a goroutine switch — about what one netpoller wake-up of a
// socket costs, without a thread per waiter (a futex wait holds one). A
// pipe, not an eventfd: a pipe's writer wakes its reader as a synchronous
// wake-up, which lets the kernel run the reader on the writer's CPU as it
// does for a socket's; an eventfd wakes it where it slept, behind an
// inter-processor interrupt.
//
// A Hub is safe for concurrent use.
type Hub struct {
	seg  *Segment
	file *os.File // the pipe's read end, in the netpoller
	rc   syscall.RawConn
	rfd  int // the pipe's read end (file's)
	wfd  int // its write end: this process's, and the peers' copies
	bell *uint32
	sum  unsafe.Pointer // hubSlots/4096 summary words
	pend unsafe.Pointer // hubSlots/64 pending words
	self *Notifier      // this hub, for wakers in this process

	mu      lockrank.Mutex // guards waiters, free; lockrank.Hub, after any lock of the library
	waiters []*Waiter      // by slot; nil for a free slot
	free    []uint32

	done chan struct{} // closed when the dispatcher has returned

	// The dispatcher's own: its look on the pipe, made once, and whether
	// that look parked.
	look   func(uintptr) bool
	parked bool
	once   sync.Once
}

// NewHub creates a hub and starts its dispatcher.
func NewHub() (*Hub, error) {
	seg, err := CreateSegmentLazy("sandirect-wake", KindWake, hubSegmentSize)
	if err != nil {
		return nil, err
	}
	mem := seg.Bytes()
	store32(word32(mem, hubSlotsOff), hubSlots)
	store32(word32(mem, hubVersionOff), hubVersion)
	store32(word32(mem, hubMagicOff), hubMagic)
	rfd, wfd, err := sys.Pipe()
	if err != nil {
		seg.Close()
		return nil, fmt.Errorf("shm: wake hub: pipe: %w", err)
	}
	h := &Hub{seg: seg, rfd: rfd, wfd: wfd, done: make(chan struct{})}
	h.mu.Init(lockrank.Hub)
	h.look = h.lookOnPipe
	// The pipe is non-blocking, so os.NewFile puts it in the netpoller.
	h.file = os.NewFile(uintptr(rfd), "sandirect-wake")
	if h.rc, err = h.file.SyscallConn(); err != nil {
		h.file.Close()
		sys.Close(wfd)
		seg.Close()
		return nil, fmt.Errorf("shm: wake hub: %w", err)
	}
	h.bell = word32(mem, hubBellOff)
	h.sum = unsafe.Pointer(&mem[hubSummaryOff])
	h.pend = unsafe.Pointer(&mem[hubPendingOff])
	h.self = &Notifier{bell: h.bell, sum: h.sum, pend: h.pend, fd: wfd, local: h}
	go h.dispatch()
	return h, nil
}

// Fds returns the hub table's memfd and the pipe's write end, to pass to
// a peer (OpenNotifier there). They stay owned by the hub.
func (h *Hub) Fds() (table, event int) { return h.seg.Fd(), h.wfd }

// Notifier returns a Notifier of this hub for wakers in this process.
func (h *Hub) Notifier() *Notifier { return h.self }

// Close stops the dispatcher and releases the hub. Waiters must be closed
// first; a Notifier of the hub in a peer wakes nothing afterwards.
func (h *Hub) Close() error {
	h.once.Do(func() {
		h.file.Close() // ends the dispatcher's read
		<-h.done
		sys.Close(h.wfd)
		h.seg.Close()
	})
	return nil
}

// NewWaiter takes a slot of the hub for one waiting goroutine at a time.
func (h *Hub) NewWaiter() (*Waiter, error) {
	w := &Waiter{hub: h, ch: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case len(h.free) > 0:
		w.slot = h.free[len(h.free)-1]
		h.free = h.free[:len(h.free)-1]
		h.waiters[w.slot] = w
	case len(h.waiters) < hubSlots:
		w.slot = uint32(len(h.waiters))
		h.waiters = append(h.waiters, w)
	default:
		return nil, fmt.Errorf("shm: wake hub: all %d slots in use", hubSlots)
	}
	return w, nil
}

// dispatch readies the waiters whose slots peers marked; it parks on the
// pipe when there are none.
func (h *Hub) dispatch() {
	defer close(h.done)
	for {
		store32(h.bell, 1) // announces: wakers signal the pipe from now on
		if h.scan() {
			// The signals that brought us here go, once their waiters
			// are on their way (a signal is written only when we
			// announced, so the pipe holds a byte or two).
			sys.PipeDrain(h.rfd)
			continue
		}
		// Park unless a waker marked a slot since the scan: its signal
		// may have come before the read began, when the poller forgets
		// readiness, but its marks are there. Every write to the pipe
		// makes an edge for the poller, read or not.
		h.parked = false
		err := h.rc.Read(h.look)
		if err != nil {
			return // closed
		}
	}
}

// lookOnPipe is the dispatcher's look on the pipe (RawConn.Read's
// function, made once in NewHub: a closure per park would allocate): done
// if a slot is marked, else park once, then done.
func (h *Hub) lookOnPipe(uintptr) bool {
	if h.parked || h.pending() {
		return true
	}
	h.parked = true
	return false
}

// pending tells whether a summary word has bits set.
func (h *Hub) pending() bool {
	for j := range hubSlots / 4096 {
		if load64(at(h.sum, uint64(j)*8)) != 0 {
			return true
		}
	}
	return false
}

// scan wakes every marked slot's waiter and tells whether there was one.
func (h *Hub) scan() bool {
	found := false
	for j := range hubSlots / 4096 {
		s := at(h.sum, uint64(j)*8)
		if load64(s) == 0 {
			continue
		}
		for sm := swap64(s, 0); sm != 0; sm &= sm - 1 {
			w := uint64(j)*64 + uint64(bits.TrailingZeros64(sm))
			for pm := swap64(at(h.pend, w*8), 0); pm != 0; pm &= pm - 1 {
				h.wakeSlot(uint32(w*64) + uint32(bits.TrailingZeros64(pm)))
				found = true
			}
		}
	}
	return found
}

func (h *Hub) wakeSlot(slot uint32) {
	h.mu.Lock()
	var w *Waiter
	if int(slot) < len(h.waiters) {
		w = h.waiters[slot]
	}
	h.mu.Unlock()
	if w != nil {
		w.post()
	}
}

// A Notifier wakes the waiters of one hub, this process's or a peer's, by
// slot. Its methods are safe for concurrent use.
type Notifier struct {
	bell *uint32
	sum  unsafe.Pointer
	pend unsafe.Pointer
	fd   int
	seg  *Segment // the peer's table; nil for a hub of this process
	// local is the hub, when it is this process's: its waiters are woken
	// directly, without the table and the pipe.
	local *Hub
}

// OpenNotifier maps a peer's hub from the two descriptors its Fds
// returned (the table and the pipe's write end), and checks the table. It
// takes ownership of both fds.
func OpenNotifier(table, event int) (*Notifier, error) {
	seg, err := OpenSegmentLazy(table, KindWake, hubSegmentSize)
	if err != nil {
		sys.Close(event)
		return nil, err
	}
	mem := seg.Bytes()
	magic, version, slots := load32(word32(mem, hubMagicOff)), load32(word32(mem, hubVersionOff)), load32(word32(mem, hubSlotsOff))
	if magic != hubMagic || version != hubVersion || slots != hubSlots {
		seg.Close()
		sys.Close(event)
		return nil, fmt.Errorf("%w: wake table magic %#x version %d slots %d", ErrCorrupt, magic, version, slots)
	}
	seg.DropFd()
	return &Notifier{
		bell: word32(mem, hubBellOff),
		sum:  unsafe.Pointer(&mem[hubSummaryOff]),
		pend: unsafe.Pointer(&mem[hubPendingOff]),
		fd:   event,
		seg:  seg,
	}, nil
}

// Notify wakes the waiter of slot, if the hub has one; a slot out of
// range (a peer's lie) wakes nothing.
func (n *Notifier) Notify(slot uint32) {
	if slot >= hubSlots {
		return
	}
	if n.local != nil {
		n.local.wakeSlot(slot)
		return
	}
	// Publish the slot, then its word, then look at the doorbell: the
	// dispatcher announces, then scans, so one of us sees the other.
	or64(at(n.pend, uint64(slot/64)*8), 1<<(slot%64))
	or64(at(n.sum, uint64(slot/4096)*8), 1<<(slot/64%64))
	if load32(n.bell) != 0 && swap32(n.bell, 0) != 0 {
		sys.PipeSignal(n.fd)
	}
}

// Close releases a peer's hub. A Notifier of this process's hub needs no
// closing.
func (n *Notifier) Close() error {
	if n.seg == nil {
		return nil
	}
	sys.Close(n.fd)
	return n.seg.Close()
}

// A Waiter is a slot of a hub on which one goroutine at a time parks:
// Park, until a Notify of its slot (from any process) or a Wake (from
// this one). Wake and the hub's dispatcher may run concurrently with Park.
type Waiter struct {
	hub      *Hub
	slot     uint32
	ch       chan struct{} // a wake-up token; capacity 1
	sleeping atomic.Uint32 // Park is between its announcement and its return
	timer    *time.Timer
	closed   bool
}

// Bell is the value a waiter stores in a shared doorbell word to announce
// that it sleeps: its slot plus one (zero means nobody sleeps).
func (w *Waiter) Bell() uint32 { return w.slot + 1 }

// Slot returns the waiter's slot in its hub.
func (w *Waiter) Slot() uint32 { return w.slot }

// Hub returns the waiter's hub.
func (w *Waiter) Hub() *Hub { return w.hub }

// post leaves a wake-up token; a token already there is enough.
func (w *Waiter) post() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// Wake wakes the goroutine parked on w, or makes the Park under way
// return; it costs one atomic load when nobody parks. For code of this
// process.
func (w *Waiter) Wake() {
	if w.sleeping.Load() != 0 {
		w.post()
	}
}

// Park sleeps until the waiter is woken or deadline passes (zero: no
// deadline; then os.ErrDeadlineExceeded). x.Ready is called after the
// waiter is marked as sleeping and before it parks: the caller has
// announced w.Bell() in the doorbells that concern it (x.Arm), and Ready
// re-checks its condition, so that a wake-up between the caller's last
// look and the park is never lost. Park reports whether Ready said true
// (then it did not park). It may return early; callers re-check and call
// it again.
func (w *Waiter) Park(x Waitable, deadline time.Time) (bool, error) {
	w.sleeping.Store(1)
	defer w.sleeping.Store(0)
	// A token left by an earlier wake-up is not dropped: the wake-up may
	// have taken the caller's announcement (a waker swaps the doorbell to
	// zero) for a change that does not end the wait yet, and a park after
	// it would never be woken. It ends this park at once instead; the
	// caller announces again and looks again (WaitStrategy).
	if x.Ready() {
		return true, nil
	}
	if deadline.IsZero() {
		<-w.ch
		return false, nil
	}
	d := time.Until(deadline)
	if d <= 0 {
		return false, os.ErrDeadlineExceeded
	}
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	select {
	case <-w.ch:
		w.timer.Stop()
		return false, nil
	case <-w.timer.C:
		return false, os.ErrDeadlineExceeded
	}
}

// Close gives the slot back to the hub. A later Notify of the slot wakes
// whichever waiter takes it next, which re-checks and parks again.
func (w *Waiter) Close() {
	h := w.hub
	h.mu.Lock()
	if !w.closed {
		w.closed = true
		h.waiters[w.slot] = nil
		h.free = append(h.free, w.slot)
	}
	h.mu.Unlock()
}

// SendHub passes h's descriptors to the peer at the other end of c, which
// opens them with RecvNotifier.
func SendHub(c *net.UnixConn, h *Hub) error {
	table, event := h.Fds()
	if err := sys.SendFds(c, []byte("hub"), table, event); err != nil {
		return fmt.Errorf("shm: send wake hub: %w", err)
	}
	return nil
}

// RecvNotifier receives a peer's hub sent with SendHub.
func RecvNotifier(c *net.UnixConn) (*Notifier, error) {
	var buf [8]byte
	_, fds, err := sys.RecvFds(c, buf[:], 2)
	if err != nil {
		return nil, fmt.Errorf("shm: receive wake hub: %w", err)
	}
	if len(fds) != 2 {
		sys.CloseAll(fds)
		return nil, fmt.Errorf("shm: receive wake hub: %d descriptors, want 2", len(fds))
	}
	return OpenNotifier(fds[0], fds[1])
}
