package shm

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// dupNotifier opens h through copies of its descriptors, as a peer
// process would: wakes go through the shared table and the pipe.
func dupNotifier(t *testing.T, h *Hub) *Notifier {
	t.Helper()
	table, event := h.Fds()
	t2, err1 := sys.Dup(table)
	e2, err2 := sys.Dup(event)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	n, err := OpenNotifier(t2, e2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// TestHubParksWithoutThreads parks thousands of goroutines, each on its
// own waiter, and checks that the process's OS threads do not grow with
// them (a futex wait holds a thread each); then it wakes every one through
// the shared table and the pipe, as a peer process does.
func TestHubParksWithoutThreads(t *testing.T) {
	const n = 3000
	h := newHub(t)
	note := dupNotifier(t, h)
	before, err := testutil.Threads()
	if err != nil {
		t.Fatal(err)
	}
	var parked, woken sync.WaitGroup
	ws := make([]*Waiter, n)
	for i := range ws {
		ws[i] = newWaiter(t, h)
	}
	errs := make(chan error, n)
	// Each waiter's condition: its flag, set before its Notify. A Park may
	// return early; the goroutine parks again until the flag is set.
	flags := make([]atomic.Bool, n)
	for i, w := range ws {
		parked.Add(1)
		woken.Add(1)
		go func() {
			defer woken.Done()
			first := true
			ready := func() bool {
				if first {
					first = false
					parked.Done()
				}
				return flags[i].Load()
			}
			deadline := time.Now().Add(time.Minute)
			for !flags[i].Load() {
				if _, err := w.Park(readyFunc(ready), deadline); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	parked.Wait()
	for _, w := range ws { // each is parked, or about to be
		for w.sleeping.Load() == 0 {
			runtime.Gosched()
		}
	}
	during, err := testutil.Threads()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("threads: %d before, %d with %d goroutines parked (GOMAXPROCS %d)", before, during, n, runtime.GOMAXPROCS(0))
	if limit := before + runtime.GOMAXPROCS(0) + 20; during > limit {
		t.Errorf("%d threads with %d parked waiters, want at most %d", during, n, limit)
	}
	for i, w := range ws {
		flags[i].Store(true)
		note.Notify(w.Slot())
	}
	woken.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a parked waiter: %v (not woken by its Notify)", err)
		}
	}
}

// TestNotifyHostileSlots: a slot out of range wakes nothing and touches
// nothing outside the table; a free slot's wake-up is lost harmlessly,
// and a slot given back and taken again wakes its new waiter only
// spuriously (it re-checks).
func TestNotifyHostileSlots(t *testing.T) {
	h := newHub(t)
	note := dupNotifier(t, h)
	for _, slot := range []uint32{hubSlots, hubSlots + 1, 1 << 31, ^uint32(0)} {
		note.Notify(slot)
	}
	note.Notify(12345) // no waiter there
	w := newWaiter(t, h)
	w.Close()
	w2 := newWaiter(t, h)
	if w2.Slot() != w.Slot() {
		t.Fatalf("slot %d not reused (got %d)", w.Slot(), w2.Slot())
	}
	// A wake-up before the waiter parks is stale: its mark may end the
	// next park early (callers look again), but not the one after.
	note.Notify(w2.Slot())
	if _, err := w2.Park(never, time.Now().Add(10*time.Millisecond)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a park after a stale wake-up: %v", err)
	}
	if _, err := w2.Park(never, time.Now().Add(10*time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a second park after a stale wake-up: %v", err)
	}
	done := make(chan error, 1)
	announced := make(chan struct{})
	go func() {
		_, err := w2.Park(readyFunc(func() bool { close(announced); return false }), time.Now().Add(20*time.Second))
		done <- err
	}()
	<-announced
	note.Notify(w2.Slot())
	if err := <-done; err != nil {
		t.Fatalf("woken slot: %v", err)
	}
}

// TestOpenNotifierRefuses: a table that is not a wake hub's is refused
// with ErrCorrupt or ErrBadSegment, and its descriptors are closed.
func TestOpenNotifierRefuses(t *testing.T) {
	s := newSegment(t, hubSegmentSize)
	f, err := s.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ev, err := sys.Eventfd()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := sys.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenNotifier(fd, ev); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrBadSegment) {
		t.Fatalf("a rings segment as a wake table: %v", err)
	}
}

// readyFunc is a Waitable of a condition alone (no doorbells).
type readyFunc func() bool

func (f readyFunc) Ready() bool { return f() }
func (readyFunc) Arm(uint32)    {}

var never = readyFunc(func() bool { return false })

// TestHubPipeStaysNearEmpty: wake-ups, one at a time and more than the
// hub's pipe holds (64 KiB), each through the table and the pipe as a
// peer's, after a stray byte in the pipe (what a signal the leader never
// needed leaves). None is lost, and the pipe never holds much more than
// hubDrainAfter bytes: a pipe left to fill refuses the next signal, and
// its waiter would sleep for ever.
func TestHubPipeStaysNearEmpty(t *testing.T) {
	const rounds = 70_000
	h := newHub(t)
	note := dupNotifier(t, h)
	w := newWaiter(t, h)
	if err := sys.PipeSignal(h.wfd); err != nil { // the stray byte
		t.Fatal(err)
	}
	var gen, ack atomic.Int64
	// The notifier waits for each round's ack on a channel, not in a
	// loop of Gosched: with one processor (GOMAXPROCS=1) a goroutine
	// that is always runnable keeps the scheduler from polling the
	// network, and the parked waiter's wake-up then waits for the
	// runtime's monitor, some 10 ms a round.
	acked := make(chan struct{}, 1)
	stop := make(chan struct{})
	notifyDone := make(chan struct{})
	go func() {
		defer close(notifyDone)
		for i := int64(1); i <= rounds; i++ {
			gen.Store(i)
			note.Notify(w.Slot())
			select {
			case <-acked:
			case <-stop:
				return
			}
		}
	}()
	defer func() {
		close(stop)
		<-notifyDone
	}()
	ready := readyFunc(func() bool { return gen.Load() > ack.Load() })
	most := 0
	for i := int64(1); i <= rounds; i++ {
		for gen.Load() < i {
			if _, err := w.Park(ready, time.Now().Add(10*time.Second)); err != nil {
				t.Fatalf("round %d: %v: a wake-up was lost (hub: %s, %d bytes in the pipe; waiter: %s)",
					i, err, h.debugState(), h.pipeBytes(), w.debugState())
			}
		}
		ack.Store(i)
		acked <- struct{}{}
		most = max(most, h.pipeBytes())
	}
	if most > hubDrainAfter+2 {
		t.Errorf("the pipe held up to %d bytes: the leader does not empty it", most)
	}
}

// TestLeaderAnnouncesAgainAfterPassingOn: a leader woken for another
// waiter's mark passes it on, and a waker of that mark took the leader's
// announcement after it was made (its signal spent before the leader
// parks again). The leader must announce again before it parks: parked
// without an announcement it sleeps through every later mark, its own
// included — the hang net/http with 16 clients found in an earlier
// version of the hub (every waiter asleep, marks pending, the doorbell
// taken, the leader in the netpoller).
func TestLeaderAnnouncesAgainAfterPassingOn(t *testing.T) {
	h := newHub(t)
	note := dupNotifier(t, h)
	lead, follow, idle := newWaiter(t, h), newWaiter(t, h), newWaiter(t, h)
	var leadFlag, followFlag atomic.Bool
	park := func(w *Waiter, flag *atomic.Bool, parked chan<- struct{}) <-chan error {
		done := make(chan error, 1)
		go func() {
			first := true
			ready := readyFunc(func() bool {
				if first {
					first = false
					close(parked)
				}
				return flag.Load()
			})
			deadline := time.Now().Add(5 * time.Second)
			for !flag.Load() {
				if _, err := w.Park(ready, deadline); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		return done
	}
	leadParked, followParked := make(chan struct{}), make(chan struct{})
	leadDone := park(lead, &leadFlag, leadParked)
	<-leadParked
	for !lead.leading.Load() {
		runtime.Gosched()
	}
	followDone := park(follow, &followFlag, followParked)
	<-followParked
	for {
		h.mu.Lock()
		n := len(h.followers)
		h.mu.Unlock()
		if n == 1 {
			break
		}
		runtime.Gosched()
	}
	// Wake the leader for a waiter that is not parked; right after its
	// announcement, the follower's waker takes it, and its signal is
	// spent (read out of the pipe) before the leader parks again.
	var once sync.Once
	hook := func() {
		once.Do(func() {
			followFlag.Store(true)
			note.Notify(follow.Slot())
			sys.PipeDrain(h.rfd)
		})
	}
	testHookAnnounced.Store(&hook)
	defer testHookAnnounced.Store(nil)
	note.Notify(idle.Slot())
	if err := <-followDone; err != nil {
		t.Fatalf("the follower: %v", err)
	}
	leadFlag.Store(true)
	note.Notify(lead.Slot())
	if err := <-leadDone; err != nil {
		t.Fatalf("the leader, after passing a mark on: %v: its own wake-up was lost (hub: %s)", err, h.debugState())
	}
}

// TestHubStampsItsSignals: a waker that signals the pipe stamps the time
// first, and a woken wait learns its length up to that stamp, not up to
// its own wake-up; a stamp outside the time it was parked (older, later
// than now, a peer's lie) is not used.
func TestHubStampsItsSignals(t *testing.T) {
	h, err := NewHub()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	w, err := h.NewWaiter()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	n := dupNotifier(t, h)

	before := time.Now()
	store32(h.bell, 1) // the leader announced that it parks
	n.Notify(w.Slot())
	if load32(h.bell) != 0 {
		t.Fatal("the notify did not take the doorbell")
	}
	if at, ok := h.signalledSince(before, time.Since(before)); !ok || at < 0 {
		t.Fatalf("no stamp within the notify: %v, %v", at, ok)
	}
	n.Notify(w.Slot()) // nobody announced: no signal, no new stamp
	stamp := load64(h.sig)
	n.Notify(w.Slot())
	if load64(h.sig) != stamp {
		t.Fatal("a notify without a signal stamped")
	}

	parked := time.Now().Add(-10 * time.Millisecond) // parked 10 ms ago
	start := parked.Add(-time.Millisecond)           // after a 1 ms spin
	for _, c := range []struct {
		name  string
		stamp time.Time
		want  func(time.Duration) bool
	}{
		{"signalled 2 ms into the park", parked.Add(2 * time.Millisecond), func(d time.Duration) bool { return d == 3*time.Millisecond }},
		{"signalled before the park", parked.Add(-time.Millisecond), func(d time.Duration) bool { return d >= 11*time.Millisecond }},
		{"stamped in the future", time.Now().Add(time.Hour), func(d time.Duration) bool { return d >= 11*time.Millisecond && d < time.Hour }},
	} {
		store64(h.sig, uint64(c.stamp.UnixNano()))
		if d := parkedFor(w, start, parked); !c.want(d) {
			t.Errorf("%s: learned %v", c.name, d)
		}
	}
	if d := parkedFor(nil, start, parked); d < 11*time.Millisecond {
		t.Errorf("no waiter (naps): learned %v, want the whole wait", d)
	}
}
