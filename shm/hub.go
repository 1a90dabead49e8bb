package shm

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
)

// A Hub is how goroutines of this process sleep until a peer process, or
// code of this process, wakes them, without holding an OS thread. A peer
// wakes a waiter by its slot number: it marks the slot in the hub's shared
// table and writes a byte to the hub's pipe when a goroutine announced
// that it is parked on it (Notifier.Notify). Of the goroutines parked on a
// hub's waiters, one — the leader — parks in the runtime's netpoller on
// the pipe, as a goroutine reading a socket does; the others park on their
// waiter's channel. Woken, the leader takes the marks: its own ends its
// wait, the others' it passes on; leaving, it hands the pipe to one of
// them. So a process holds one pipe for any number of waiting goroutines,
// a peer holds one descriptor per hub it wakes, and when one goroutine
// waits — a client, a server of one connection — a wake-up costs what a
// socket's does: one write and the netpoller's wake-up of that goroutine,
// no second one (a dispatcher goroutine of its own cost a goroutine switch
// and the wake-up of a second thread). A pipe, not an eventfd: a pipe's
// writer wakes its reader as a synchronous wake-up, which lets the kernel
// run the reader on the writer's CPU, as it does for a socket; an eventfd
// wakes it where it slept, behind an inter-processor interrupt
// (docs/performance.md).
//
// A Hub is safe for concurrent use.
type Hub struct {
	seg  *Segment
	file *os.File // the pipe's read end, in the netpoller
	rc   syscall.RawConn
	rfd  int // the pipe's read end (file's)
	wfd  int // its write end: this process's signals, and the peers' copies
	bell *uint32
	sig  *uint64        // when a waker last signalled the pipe (hubSignalOff)
	sum  unsafe.Pointer // hubSlots/4096 summary words
	pend unsafe.Pointer // hubSlots/64 pending words
	self *Notifier      // this hub, for wakers in this process

	mu        lockrank.Mutex // guards waiters, free, leader, followers, fileDL, closed; lockrank.Hub, after any lock of the chain
	waiters   []*Waiter      // by slot; nil for a free slot
	free      []uint32
	leader    *Waiter   // parked on the pipe, or appointed to; nil: none
	followers []*Waiter // parked on their channels, in parking order
	fileDL    time.Time // the pipe's read deadline, as last set
	closed    bool
	leaders   sync.WaitGroup // one while there is a leader: Close waits for it
	once      sync.Once

	// The leader's own (handed over under mu with the lead): signals
	// that may lie in the pipe, unread.
	debt int
}

// hubDrainAfter is how many signals a leader lets the pipe hold before it
// empties it: a signal is a byte, written only when a waker took an
// announcement, and the bytes need not be read one by one — every write
// makes an edge for the netpoller, and the marks in the table, not the
// bytes, say who is woken. So the pipe is read once in so many wake-ups,
// not on each (a system call), and never fills (a full pipe would refuse
// the next signal: 16 pages, or 2 for a user over its pipe quota, hold
// far more than this).
const hubDrainAfter = 256

// testHookAnnounced, when set, runs after each of a leader's announcements,
// before it takes the marks.
var testHookAnnounced atomic.Pointer[func()]

// NewHub creates a hub.
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
	h := &Hub{seg: seg, rfd: rfd, wfd: wfd}
	h.mu.Init(lockrank.Hub)
	// The pipe is non-blocking, so os.NewFile puts it in the netpoller.
	h.file = os.NewFile(uintptr(rfd), "sandirect-wake")
	if h.rc, err = h.file.SyscallConn(); err != nil {
		h.file.Close()
		sys.Close(wfd)
		seg.Close()
		return nil, fmt.Errorf("shm: wake hub: %w", err)
	}
	h.bell = word32(mem, hubBellOff)
	h.sig = word64(mem, hubSignalOff)
	h.sum = unsafe.Pointer(&mem[hubSummaryOff])
	h.pend = unsafe.Pointer(&mem[hubPendingOff])
	h.self = &Notifier{bell: h.bell, sig: h.sig, sum: h.sum, pend: h.pend, fd: wfd, local: h}
	return h, nil
}

// Fds returns the hub table's memfd and the pipe's write end, to pass to
// a peer (OpenNotifier there). They stay owned by the hub.
func (h *Hub) Fds() (table, event int) { return h.seg.Fd(), h.wfd }

// Notifier returns a Notifier of this hub for wakers in this process.
func (h *Hub) Notifier() *Notifier { return h.self }

// ErrHubClosed ends the waits on a hub that was closed under them.
var ErrHubClosed = errors.New("shm: wake hub closed")

// Close releases the hub; a leader parked on it returns ErrHubClosed. A
// Notifier of the hub in a peer wakes nothing afterwards.
func (h *Hub) Close() error {
	h.once.Do(func() {
		h.mu.Lock()
		h.closed = true
		followers := h.followers
		h.followers = nil
		h.mu.Unlock()
		for _, f := range followers {
			f.post()
		}
		h.file.Close()   // ends the leader's read
		h.leaders.Wait() // the table is unmapped once no leader reads it
		sys.Close(h.wfd)
		h.seg.Close()
	})
	return nil
}

// NewWaiter takes a slot of the hub for one waiting goroutine at a time.
func (h *Hub) NewWaiter() (*Waiter, error) {
	w := &Waiter{hub: h, ch: make(chan struct{}, 1)}
	w.readPipe = w.lookOnPipe // made once: a closure per park would allocate
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

// pending tells whether a summary word has bits set.
func (h *Hub) pending() bool {
	for j := range hubSlots / 4096 {
		if load64(at(h.sum, uint64(j)*8)) != 0 {
			return true
		}
	}
	return false
}

// take clears the marks of the table and wakes the waiters they name but
// self; it tells whether self was among them, and whether any was.
func (h *Hub) take(self *Waiter) (mine, any bool) {
	for j := range hubSlots / 4096 {
		s := at(h.sum, uint64(j)*8)
		if load64(s) == 0 {
			continue
		}
		for sm := swap64(s, 0); sm != 0; sm &= sm - 1 {
			w := uint64(j)*64 + uint64(bits.TrailingZeros64(sm))
			for pm := swap64(at(h.pend, w*8), 0); pm != 0; pm &= pm - 1 {
				slot := uint32(w*64) + uint32(bits.TrailingZeros64(pm))
				any = true
				if self != nil && slot == self.slot {
					mine = true
				} else {
					h.wakeSlot(slot)
				}
			}
		}
	}
	return mine, any
}

// wakeSlot wakes the waiter of slot, if there is one: a peer (or a ring
// of this process) saw it announced.
func (h *Hub) wakeSlot(slot uint32) {
	h.mu.Lock()
	var w *Waiter
	if int(slot) < len(h.waiters) {
		w = h.waiters[slot]
	}
	h.mu.Unlock()
	if w != nil {
		w.wake()
	}
}

// signal wakes the leader out of the netpoller: the pipe, as a peer
// does, for a wake-up from this process.
func (h *Hub) signal() {
	if load32(h.bell) != 0 && swap32(h.bell, 0) != 0 {
		stampSignal(h.sig)
		sys.PipeSignal(h.wfd)
	}
}

// stampSignal stores the time of a signal of the pipe, before the signal.
func stampSignal(sig *uint64) { store64(sig, uint64(time.Now().UnixNano())) }

// signalledSince tells how long after since (wall clock) a waker last
// signalled the hub's pipe, if it did after since and no later than
// within: a wait's length without its wake-up (WaitStrategy). A stamp out
// of that window — an older signal, a peer's clock jumped, a peer's lie —
// reads as none.
func (h *Hub) signalledSince(since time.Time, within time.Duration) (time.Duration, bool) {
	d := time.Duration(int64(load64(h.sig)) - since.UnixNano())
	return d, d > 0 && d <= within
}

// join parks w: as the leader if there is none (or w was appointed), else
// as a follower. It reports which, and false too when the hub is closed.
func (h *Hub) join(w *Waiter) (lead, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false, false
	}
	if h.leader == nil {
		h.leaders.Add(1)
		h.leader = w
	}
	if h.leader == w {
		w.leading.Store(true)
		return true, true
	}
	h.followers = append(h.followers, w)
	return false, true
}

// leave ends w's park. A leader hands the pipe to the follower that
// parked last (the likeliest to be woken next, and the others stay
// asleep); a follower appointed meanwhile does the same.
func (h *Hub) leave(w *Waiter) {
	h.mu.Lock()
	if i := slices.Index(h.followers, w); i >= 0 {
		h.followers = slices.Delete(h.followers, i, i+1)
	}
	var next *Waiter
	if h.leader == w {
		w.leading.Store(false)
		h.leader = nil
		if n := len(h.followers); n > 0 && !h.closed {
			next = h.followers[n-1]
			h.followers = h.followers[:n-1]
			h.leader = next // the leaders count passes to it
		} else {
			h.leaders.Done()
		}
	}
	h.mu.Unlock()
	if next != nil {
		next.post()
	}
}

// lead parks w on the pipe until its slot is marked, a token comes on its
// channel (Wake), or deadline passes; it passes the other marks on.
func (h *Hub) lead(w *Waiter, deadline time.Time) error {
	h.mu.Lock()
	if !deadline.Equal(h.fileDL) {
		h.fileDL = deadline
		h.file.SetReadDeadline(deadline)
	}
	h.mu.Unlock()
	for {
		h.announce()
		if f := testHookAnnounced.Load(); f != nil {
			(*f)()
		}
		mine, any := h.take(w)
		if mine || w.took() {
			return nil
		}
		if any {
			// A waker of the slots just taken may have taken the
			// announcement too, and with it the only signal: announce
			// again and look again before parking (parked without an
			// announcement, the leader would sleep through every later
			// mark).
			continue
		}
		// Park unless a mark or a token came since: a signal before the
		// read began, when the netpoller forgets readiness, left its mark.
		// Every write to the pipe makes an edge for the netpoller, read or
		// not.
		w.parked = false
		err := h.rc.Read(w.readPipe)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return os.ErrDeadlineExceeded
			}
			return ErrHubClosed
		}
	}
}

// announce tells wakers that the leader is parked, or about to be: they
// signal the pipe from now on. An announcement found taken is a signal
// in the pipe, or on its way; once in hubDrainAfter the leader empties the
// pipe first (what a signal written after the read carries is for the new
// announcement, and its mark is what counts).
func (h *Hub) announce() {
	if h.debt >= hubDrainAfter {
		sys.PipeDrain(h.rfd)
		h.debt = 0
	}
	if swap32(h.bell, 1) == 0 {
		h.debt++
	}
}

// A Notifier wakes the waiters of one hub, this process's or a peer's, by
// slot. Its methods are safe for concurrent use.
type Notifier struct {
	bell *uint32
	sig  *uint64
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
		sig:  word64(mem, hubSignalOff),
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
	// leader announces, then scans, so one of us sees the other.
	or64(at(n.pend, uint64(slot/64)*8), 1<<(slot%64))
	or64(at(n.sum, uint64(slot/4096)*8), 1<<(slot/64%64))
	if load32(n.bell) != 0 && swap32(n.bell, 0) != 0 {
		stampSignal(n.sig)
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
// this one). Wake and Notify may run concurrently with Park.
type Waiter struct {
	hub      *Hub
	slot     uint32
	ch       chan struct{} // a wake-up token; capacity 1
	sleeping atomic.Uint32 // Park is between its announcement and its return
	leading  atomic.Bool   // parked on the hub's pipe (Hub.lead)
	parked   bool          // lead: the look on the pipe said park once
	readPipe func(uintptr) bool
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

// lookOnPipe is the leader's look on the pipe (RawConn.Read's function):
// done if a slot is marked or a token came, else park once, then done.
func (w *Waiter) lookOnPipe(uintptr) bool {
	if w.parked || w.hub.pending() || len(w.ch) > 0 {
		return true
	}
	w.parked = true
	return false
}

// took takes a token if one is there.
func (w *Waiter) took() bool {
	select {
	case <-w.ch:
		return true
	default:
		return false
	}
}

// post leaves a wake-up token; a token already there is enough.
func (w *Waiter) post() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// wake leaves a token and, if w leads its hub, signals the pipe it is
// parked on: the token first, then the look, as lead looks at the token
// after it announced that it leads.
func (w *Waiter) wake() {
	w.post()
	if w.leading.Load() {
		w.hub.signal()
	}
}

// Wake wakes the goroutine parked on w, or makes the Park under way
// return; it costs one atomic load when nobody parks. For code of this
// process.
func (w *Waiter) Wake() {
	if w.sleeping.Load() != 0 {
		w.wake()
	}
}

// Park sleeps until the waiter is woken or deadline passes (zero: no
// deadline; then os.ErrDeadlineExceeded). x.Ready is called after the
// waiter is marked as sleeping and before it parks: the caller has
// announced w.Bell() in the doorbells that concern it (x.Arm), and Ready
// re-checks its condition, so that a wake-up between the caller's last
// look and the park is never lost; Park announces again itself when it
// goes on after a wake-up. Park reports whether Ready said true (then it
// did not park). It may return early; callers re-check and call it again.
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
	h := w.hub
	defer h.leave(w)
	for {
		lead, ok := h.join(w)
		if !ok {
			return false, ErrHubClosed
		}
		if lead {
			return false, h.lead(w, deadline)
		}
		if err := w.await(deadline); err != nil {
			return false, err
		}
		h.mu.Lock()
		appointed := h.leader == w
		h.mu.Unlock()
		if !appointed {
			return false, nil
		}
		// Handed the pipe. The token may also have been a wake-up that
		// took our announcement: announce again and look, then lead.
		x.Arm(w.Bell())
		if x.Ready() {
			return true, nil
		}
	}
}

// await sleeps on w's channel until a token comes or deadline passes.
func (w *Waiter) await(deadline time.Time) error {
	if deadline.IsZero() {
		<-w.ch
		return nil
	}
	d := time.Until(deadline)
	if d <= 0 {
		return os.ErrDeadlineExceeded
	}
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	select {
	case <-w.ch:
		w.timer.Stop()
		return nil
	case <-w.timer.C:
		return os.ErrDeadlineExceeded
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
