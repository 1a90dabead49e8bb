package shm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// WaitMode says how a ring side waits for its peer.
type WaitMode uint8

const (
	// WaitAdaptive spins for up to WaitConfig.Spin while spinning pays,
	// then parks (WaitStrategy).
	WaitAdaptive WaitMode = iota
	// WaitBusyPoll spins until the condition holds or the deadline passes;
	// it never sleeps and never needs a wake-up.
	WaitBusyPoll
	// WaitBlock parks at once.
	WaitBlock
)

func (m WaitMode) String() string {
	switch m {
	case WaitAdaptive:
		return "adaptive"
	case WaitBusyPoll:
		return "busy"
	case WaitBlock:
		return "block"
	}
	return fmt.Sprintf("WaitMode(%d)", uint8(m))
}

// ParseWaitMode parses "adaptive", "busy" or "block".
func ParseWaitMode(s string) (WaitMode, error) {
	for _, m := range []WaitMode{WaitAdaptive, WaitBusyPoll, WaitBlock} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("shm: unknown wait mode %q (want adaptive, busy or block)", s)
}

// WaitConfig configures how a ring side waits. The zero value means
// DefaultWaitConfig.
type WaitConfig struct {
	Mode WaitMode
	// Spin is how long WaitAdaptive spins before it parks. A wake-up
	// costs many cache-line hand-offs, so a spin catches a quick answer
	// without a system call (docs/performance.md, "shm: waiting"); the
	// strategy stops spinning while spins do not catch it. Waits spin
	// tightly for at most TightSpin; a Spin longer than that serves
	// waits too long for it (the peer's work takes hundreds of
	// microseconds, as a 64 KiB gRPC call's does) with a polite spin,
	// which yields its CPU to the kernel's other threads as it goes:
	// lower latency for such waits, for more CPU time (WaitStrategy).
	Spin time.Duration
}

// DefaultSpin is the default spin phase of WaitAdaptive: about one and a
// half times what parking and waking a goroutine across two vCPUs of a
// virtual machine can cost, so that two sides of a request/response that
// both spin stay spinning (docs/performance.md, "A spin that yields").
const DefaultSpin = 60 * time.Microsecond

// TightSpin is the longest an adaptive wait spins without yielding its
// CPU to other threads: waits longer than that spin, if the configured
// Spin is longer, politely (WaitStrategy).
const TightSpin = DefaultSpin

// DefaultWaitConfig returns adaptive waiting with DefaultSpin.
func DefaultWaitConfig() WaitConfig { return WaitConfig{Mode: WaitAdaptive, Spin: DefaultSpin} }

// Validate reports a configuration that cannot work.
func (c WaitConfig) Validate() error {
	if c.Mode > WaitBlock {
		return fmt.Errorf("shm: invalid wait mode %d", c.Mode)
	}
	if c.Spin < 0 {
		return fmt.Errorf("shm: negative spin time %v", c.Spin)
	}
	return nil
}

func (c WaitConfig) orDefault() WaitConfig {
	if c == (WaitConfig{}) {
		return DefaultWaitConfig()
	}
	if c.Mode == WaitAdaptive && c.Spin == 0 {
		c.Spin = DefaultSpin
	}
	return c
}

// WaitStats counts how a side's waits ended. Ready+Spun+Slept is the number
// of waits; Wakes counts wake-ups this side issued to its peer.
type WaitStats struct {
	Ready uint64 // the condition held at the first look
	Spun  uint64 // it came true while spinning
	Slept uint64 // the side parked at least once
	Wakes uint64 // wake-ups issued to the peer
}

// SpinCheckEvery is how many looks a spinning wait takes between looks at
// the clock, the deadline and the failure state.
const SpinCheckEvery = 16

// yieldEvery is how many clock looks a spin takes between yields
// (runtime.Gosched): a few hundred microseconds, with a look and its
// Pause about 25 ns.
const yieldEvery = 1024

// politeEvery is how many clock looks a polite spin takes between
// yields of its thread's CPU (sched_yield): a couple of microseconds.
const politeEvery = 4

// A Waitable is what a wait waits for.
type Waitable interface {
	// Ready looks once, without blocking; true ends the wait (the
	// condition holds, or something else ends it: the caller knows).
	Ready() bool
	// Arm stores bell in the shared doorbell words the wait sleeps on —
	// the waiter's Bell() to announce the sleep, zero to withdraw it.
	Arm(bell uint32)
}

// Outcome tells how a wait ended.
type Outcome uint8

const (
	WaitedReady Outcome = iota // the first look found it
	WaitedSpun                 // found while spinning
	WaitedSlept                // parked at least once
)

// WaitStrategy is the one way everything in sandirect waits for a peer:
// rings, completion queues and connections (as Aeron's IdleStrategy is one
// thing). It looks; spins, as the mode says, yielding the processor to
// other goroutines now and then; then announces on the doorbells and
// parks on a Waiter — in the Go scheduler, never in a blocking system
// call. In WaitAdaptive it spins only while spinning pays: while the waits
// last longer than the spin on average, they park at once (a spin that
// cannot catch its peer only takes a CPU from the goroutines and
// processes that do the work), and a spin now and then tells when they
// got short again. Its state is its caller's: not safe for concurrent use.
//
// With a Spin longer than TightSpin, waits whose mean is over the tight
// spin's bar but under the long one's spin up to Spin politely: the
// thread offers its CPU to the kernel (sched_yield) every couple of
// microseconds. A thread the kernel woke onto the spinner's CPU — the
// peer process's, or one of this process's own that the Go scheduler
// woke for a goroutine handed on — would otherwise wait there until the
// spinner's time slice ends, hundreds of microseconds
// (docs/performance.md, "A polite spin").
type WaitStrategy struct {
	cfg WaitConfig
	// adaptive: the waits' running mean length (a moving average of the
	// time from the first look to the end), and the waits since the last
	// spin. A wait spins when the mean is under Spin, and one in
	// probeEvery does anyway: while waits park, their measured length
	// includes the wake-up, and only a spin can tell that they got short.
	mean  time.Duration
	since uint8
	// runnable is the spin's sample of runnableMetric (othersRunnable).
	runnable [1]metrics.Sample
	// politeYields counts the polite spins' yields of the CPU (tests).
	politeYields uint64
}

// spinPays: an adaptive wait spins while its waits last less than this
// many spins on average (spins).
const spinPays = 2

// probeEvery is how often, in waits, an adaptive wait whose recent waits
// were long spins all the same.
const probeEvery = 16

// NewWaitStrategy returns the strategy for cfg (zero: the default).
//
// A fresh strategy parks: its mean starts at coldWaits bars, so that its
// waits spin once a few of them have shown that they are short (or a
// probe catches one). A connection that is dialed, used
// for one request and closed does not spin on waits that need its
// listener's accept and handshake first, on the CPU that work needs.
func NewWaitStrategy(cfg WaitConfig) WaitStrategy {
	s := WaitStrategy{cfg: cfg.orDefault()}
	s.mean = coldWaits * spinPays * s.cfg.Spin
	return s
}

// coldWaits sets a fresh strategy's mean wait, in spinning bars
// (NewWaitStrategy), and the longest wait the mean counts (learn): with
// waits a sixth of the bar, the mean falls under it after 6 waits
// (weight 1/8 each); with waits of nine tenths of it, after 18.
const coldWaits = 2

// Config returns the configuration in force.
func (s *WaitStrategy) Config() WaitConfig { return s.cfg }

// naps bound how a side without a Waiter sleeps: it polls with growing
// naps (a timer in the Go scheduler), as nobody can wake it.
const (
	firstNap = time.Microsecond
	maxNap   = 100 * time.Microsecond
)

// Wait waits until x.Ready() reports true or deadline passes (zero: no
// deadline; then os.ErrDeadlineExceeded). It parks on w (nil: naps). It
// returns as soon as Ready says true, and never calls it again then: Ready
// may consume what it found.
func (s *WaitStrategy) Wait(x Waitable, w *Waiter, deadline time.Time) (Outcome, error) {
	if x.Ready() {
		return WaitedReady, nil
	}
	if !deadline.IsZero() && time.Now().After(deadline) {
		return WaitedReady, os.ErrDeadlineExceeded // one look was all it asked for
	}
	var start time.Time
	switch s.cfg.Mode {
	case WaitBusyPoll:
		return WaitedSpun, s.spin(x, deadline, time.Time{}, false)
	case WaitAdaptive:
		start = time.Now()
		if d, polite := s.spins(); d > 0 {
			err := s.spin(x, deadline, start.Add(d), polite)
			if err == nil {
				s.learn(time.Since(start))
				return WaitedSpun, nil
			}
			if err != errSpinOver {
				return WaitedSpun, err
			}
		}
	}
	if s.cfg.Mode != WaitAdaptive {
		return WaitedSlept, park(x, w, deadline)
	}
	parked := time.Now()
	err := park(x, w, deadline)
	if err == nil {
		s.learn(parkedFor(w, start, parked))
	}
	return WaitedSlept, err
}

// parkedFor is how long an adaptive wait that parked at parked lasted
// from its start: until the peer signalled the hub the waiter parked on,
// when a signal came while it was parked (the hub's stamp), else until
// now. The waiter's own wake-up is not the peer's answer: learned into
// the mean, it would keep two sides that both park over the bar, each
// wait as long as two wake-ups, though they would answer each other at
// once spinning (docs/performance.md, "Finding the spinning state
// again").
func parkedFor(w *Waiter, start, parked time.Time) time.Duration {
	now := time.Now()
	if w != nil {
		if until, ok := w.hub.signalledSince(parked, now.Sub(parked)); ok {
			return parked.Sub(start) + until
		}
	}
	return now.Sub(start)
}

// spins tells how long an adaptive wait spins, and whether politely: up
// to the tight spin if its recent waits were shorter than spinPays tight
// spins on average, or it is the probe; else up to Spin, politely, if
// Spin is longer and the waits were shorter than spinPays of it; else
// not at all (0).
//
// Not one spin: two sides that both park see each wait last as long as
// the other's wake-up, and where a wake-up takes about a spin (as on a
// small virtual machine) both would go on parking, each wait
// long because the other parks, though a ping-pong between two spinning
// sides answers in a microsecond. A probe cannot show it: one side's spin
// still waits for the other's wake-up. Waits under two spins keep both
// spinning, and a wait that long costs a spin that misses no more than it
// costs the wait (docs/performance.md, "shm: waiting").
func (s *WaitStrategy) spins() (time.Duration, bool) {
	tight := min(s.cfg.Spin, TightSpin)
	if s.since++; s.mean < spinPays*tight || s.since >= probeEvery {
		s.since = 0
		return tight, false
	}
	if s.cfg.Spin > tight && s.mean < spinPays*s.cfg.Spin {
		return s.cfg.Spin, true
	}
	return 0, false
}

// learn adds a wait of d to the running mean (weight 1/8), counting no
// wait as longer than coldWaits bars: a connection that idled for a
// second, or whose process stopped for a collection, spins again once
// its waits are short, not after the hundreds of waits that a second in
// the mean would take to wear off.
func (s *WaitStrategy) learn(d time.Duration) {
	s.mean += (min(d, coldWaits*spinPays*s.cfg.Spin) - s.mean) / 8
}

// runnableMetric counts the process's goroutines that wait for a
// processor: in its local run queues (their next-to-run slots too) and
// the global one.
const runnableMetric = "/sched/goroutines/runnable:goroutines"

// othersRunnable tells whether a goroutine of this process waits for a
// processor. Reading the one metric takes the scheduler's lock for a
// walk over the processors' queues, tens of nanoseconds; the sample is
// the strategy's, so that nothing is allocated. A runtime without the
// metric reads as no.
func (s *WaitStrategy) othersRunnable() bool {
	m := s.runnable[:]
	if m[0].Name == "" {
		m[0].Name = runnableMetric
	}
	metrics.Read(m)
	return m[0].Value.Kind() == metrics.KindUint64 && m[0].Value.Uint64() > 0
}

// errSpinOver ends a spin whose time is up.
var errSpinOver = errors.New("spin over")

// spin looks until x is ready, deadline passes or, if end is not zero,
// end passes (errSpinOver). A polite spin yields its thread's CPU every
// politeEvery clock looks.
func (s *WaitStrategy) spin(x Waitable, deadline, end time.Time, polite bool) error {
	for i := 1; ; i++ {
		if x.Ready() {
			return nil
		}
		pause() // the next look sees the peer's store sooner (Pause)
		if i%SpinCheckEvery == 0 {
			if !deadline.IsZero() || !end.IsZero() {
				now := time.Now()
				if !deadline.IsZero() && now.After(deadline) {
					return os.ErrDeadlineExceeded
				}
				if !end.IsZero() && now.After(end) {
					return errSpinOver
				}
			}
			// A spinner holds its processor, and a goroutine readied
			// behind it (a handler the spinner's own reader started, the
			// writer the handler woke) waits for it: the answer the spin
			// waits for may be that goroutine's work. So it yields as
			// soon as any goroutine of the process waits for a
			// processor, and otherwise only now and then: Gosched wakes
			// an idle processor's thread to look for work, which on a
			// small machine takes a CPU from the peer we wait for
			// (docs/performance.md, "A spin that yields").
			if s.othersRunnable() || i%(SpinCheckEvery*yieldEvery) == 0 {
				runtime.Gosched()
			}
			if polite && i%(SpinCheckEvery*politeEvery) == 0 {
				s.politeYields++
				sys.YieldCPU() // a raw sched_yield: docs/performance.md, "A polite spin"
			}
		}
	}
}

// park announces, re-checks and parks until x is ready.
func park(x Waitable, w *Waiter, deadline time.Time) error {
	if w == nil {
		for nap := firstNap; ; nap = min(2*nap, maxNap) {
			if x.Ready() {
				return nil
			}
			if !deadline.IsZero() && time.Now().After(deadline) {
				return os.ErrDeadlineExceeded
			}
			time.Sleep(nap)
		}
	}
	for {
		// Announce, then re-check (in Park): a waker makes its change,
		// then takes the doorbell, so one of us sees the other.
		x.Arm(w.Bell())
		ok, err := w.Park(x, deadline)
		x.Arm(0)
		if ok || x.Ready() {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
