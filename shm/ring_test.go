package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newRing returns a producer and a consumer over a fresh ring of capacity
// bytes in its own segment.
func newRing(t testing.TB, capacity int, pc, cc WaitConfig) (*Producer, *Consumer) {
	t.Helper()
	s, err := CreateSegment("ring", KindRings, SegmentHeaderSize+RingSize(capacity))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	region, err := s.Region(SegmentHeaderSize, RingSize(capacity))
	if err != nil {
		t.Fatal(err)
	}
	if err := InitRing(region, capacity); err != nil {
		t.Fatal(err)
	}
	p, err := NewProducer(region, pc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(region, cc)
	if err != nil {
		t.Fatal(err)
	}
	h := newHub(t)
	p.SetWake(newWaiter(t, h), h.Notifier())
	c.SetWake(newWaiter(t, h), h.Notifier())
	return p, c
}

// newHub returns a hub closed when the test ends.
func newHub(t testing.TB) *Hub {
	t.Helper()
	h, err := NewHub()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func newWaiter(t testing.TB, h *Hub) *Waiter {
	t.Helper()
	w, err := h.NewWaiter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

func TestInitRingRefuses(t *testing.T) {
	buf := make([]byte, RingSize(1<<16)+lineSize)
	// Find a 128-byte aligned start inside buf.
	start := 0
	for ; start < lineSize; start++ {
		if p := &buf[start]; uintptrOf(p)%lineSize == 0 {
			break
		}
	}
	region := buf[start:]
	for _, c := range []struct {
		name     string
		region   []byte
		capacity int
	}{
		{"not a power of two", region, 1000},
		{"too small", region, 128},
		{"region too short", region[:RingSize(4096)-1], 4096},
		{"misaligned", buf[start+8:], 4096},
	} {
		if err := InitRing(c.region, c.capacity); err == nil {
			t.Errorf("%s: InitRing succeeded", c.name)
		}
	}
}

func TestRingWriteRead(t *testing.T) {
	p, c := newRing(t, 4096, WaitConfig{}, WaitConfig{})
	if _, ok, err := c.Poll(); ok || err != nil {
		t.Fatalf("empty ring: ok %v err %v", ok, err)
	}
	msgs := []string{"", "a", "hello", "exactly8", "nine byte", string(bytes.Repeat([]byte("x"), 1000))}
	for i, m := range msgs {
		if err := p.Write(uint16(i+7), []byte(m), time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range msgs {
		rec, ok, err := c.Poll()
		if !ok || err != nil {
			t.Fatalf("record %d: ok %v err %v", i, ok, err)
		}
		if rec.Tag != uint16(i+7) || string(rec.Data) != m {
			t.Fatalf("record %d: tag %d data %q", i, rec.Tag, rec.Data)
		}
	}
	if _, ok, _ := c.Poll(); ok {
		t.Fatal("extra record")
	}
	c.Release()
}

func TestReserveCommitPartial(t *testing.T) {
	p, c := newRing(t, 4096, WaitConfig{}, WaitConfig{})
	buf, err := p.Reserve(100, time.Time{})
	if err != nil || len(buf) != 100 {
		t.Fatalf("Reserve: %d bytes, %v", len(buf), err)
	}
	copy(buf, "partial")
	if _, ok, _ := c.Poll(); ok {
		t.Fatal("record visible before Commit")
	}
	if _, err := p.Reserve(1, time.Time{}); err == nil {
		t.Fatal("second Reserve while one is pending succeeded")
	}
	if err := p.Commit(1, 101); err == nil {
		t.Fatal("Commit beyond the reservation succeeded")
	}
	if err := p.Commit(3, 7); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(3, 7); err == nil {
		t.Fatal("Commit without Reserve succeeded")
	}
	rec, ok, err := c.Poll()
	if !ok || err != nil || string(rec.Data) != "partial" || rec.Tag != 3 {
		t.Fatalf("got %q tag %d ok %v err %v", rec.Data, rec.Tag, ok, err)
	}
}

func TestRingTooLarge(t *testing.T) {
	p, _ := newRing(t, 4096, WaitConfig{}, WaitConfig{})
	if p.MaxPayload() != 4096/2-16 {
		t.Fatalf("MaxPayload %d", p.MaxPayload())
	}
	if err := p.Write(0, make([]byte, p.MaxPayload()+1), time.Time{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized write: %v", err)
	}
	if err := p.Write(0, make([]byte, p.MaxPayload()), time.Time{}); err != nil {
		t.Fatalf("largest write: %v", err)
	}
}

// TestRingWrapRandom pushes records of random sizes through a small ring
// with the consumer lagging by a random amount, so records wrap, padding
// appears at every offset, and the ring runs full; every record arrives
// intact, in order.
func TestRingWrapRandom(t *testing.T) {
	const capacity = 1024
	p, c := newRing(t, capacity, WaitConfig{Mode: WaitBusyPoll}, WaitConfig{Mode: WaitBusyPoll})
	rng := rand.New(rand.NewPCG(1, 2))
	var sent, got uint64
	pending := 0
	payload := make([]byte, p.MaxPayload())
	for i := 0; i < 200000; i++ {
		n := rng.IntN(p.MaxPayload() + 1)
		if rng.IntN(4) == 0 {
			n = rng.IntN(24)
		}
		for {
			// Try without waiting: a full ring must be drained by us.
			buf, err := p.Reserve(n, time.Now().Add(-time.Second))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if pending == 0 {
					t.Fatalf("ring full with nothing pending (n=%d)", n)
				}
				pending -= drain(t, c, &got, rng.IntN(pending)+1)
				c.Release()
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			fill(payload[:n], sent)
			copy(buf, payload[:n])
			if err := p.Commit(uint16(sent), n); err != nil {
				t.Fatal(err)
			}
			sent++
			pending++
			break
		}
		if rng.IntN(8) == 0 {
			k := drain(t, c, &got, rng.IntN(pending+1))
			pending -= k
			c.Release()
		}
	}
	drain(t, c, &got, pending)
	if got != sent {
		t.Fatalf("sent %d, got %d", sent, got)
	}
}

// fill writes a pattern derived from seq into b.
func fill(b []byte, seq uint64) {
	for i := range b {
		b[i] = byte(seq*31 + uint64(i))
	}
}

func drain(t *testing.T, c *Consumer, got *uint64, k int) int {
	t.Helper()
	for i := 0; i < k; i++ {
		rec, ok, err := c.Poll()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return i
		}
		if rec.Tag != uint16(*got) {
			t.Fatalf("record %d has tag %d", *got, rec.Tag)
		}
		for j, b := range rec.Data {
			if b != byte(*got*31+uint64(j)) {
				t.Fatalf("record %d byte %d corrupt", *got, j)
			}
		}
		*got++
	}
	return k
}

func TestRingClose(t *testing.T) {
	t.Run("producer", func(t *testing.T) {
		p, c := newRing(t, 4096, WaitConfig{}, WaitConfig{Mode: WaitBlock})
		p.Write(1, []byte("last words"), time.Time{})
		p.Close()
		if err := p.Write(1, []byte("more"), time.Time{}); !errors.Is(err, ErrClosed) {
			t.Fatalf("write after close: %v", err)
		}
		rec, err := c.Next(time.Time{})
		if err != nil || string(rec.Data) != "last words" {
			t.Fatalf("committed record lost after close: %q %v", rec.Data, err)
		}
		if _, err := c.Next(time.Time{}); !errors.Is(err, ErrClosed) {
			t.Fatalf("read after drain: %v", err)
		}
	})
	t.Run("consumer wakes blocked producer", func(t *testing.T) {
		p, c := newRing(t, 256, WaitConfig{Mode: WaitBlock}, WaitConfig{})
		done := make(chan error, 1)
		go func() {
			for {
				if err := p.Write(0, make([]byte, 100), time.Time{}); err != nil {
					done <- err
					return
				}
			}
		}()
		// Wait until the producer has filled the ring and sleeps.
		for load32(p.pBell) == 0 {
			select {
			case err := <-done:
				t.Fatalf("producer stopped early: %v", err)
			default:
			}
		}
		c.Close()
		select {
		case err := <-done:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("producer got %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("blocked producer not woken by consumer close")
		}
	})
	t.Run("fail wakes blocked consumer", func(t *testing.T) {
		_, c := newRing(t, 4096, WaitConfig{}, WaitConfig{Mode: WaitBlock})
		errPeerGone := errors.New("peer gone")
		done := make(chan error, 1)
		go func() { _, err := c.Next(time.Time{}); done <- err }()
		for load32(c.cBell) == 0 {
		}
		c.Fail(errPeerGone)
		select {
		case err := <-done:
			if !errors.Is(err, errPeerGone) {
				t.Fatalf("consumer got %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("blocked consumer not woken by Fail")
		}
	})
}

func TestRingDeadline(t *testing.T) {
	for _, mode := range []WaitMode{WaitAdaptive, WaitBusyPoll, WaitBlock} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := WaitConfig{Mode: mode, Spin: time.Millisecond}
			p, c := newRing(t, 256, cfg, cfg)
			if _, err := c.Next(time.Now().Add(20 * time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Next on empty ring: %v", err)
			}
			for {
				err := p.Write(0, make([]byte, 64), time.Now().Add(20*time.Millisecond))
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			// The ring still works after deadlines.
			if _, err := c.Next(time.Time{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNoLostWakeup hands records one by one between two goroutines over a
// tiny ring in block and short-spin modes, so both sides sleep and wake
// constantly. A lost wake-up hangs a side; the watchdog then fails the test.
func TestNoLostWakeup(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	for _, cfg := range []WaitConfig{{Mode: WaitBlock}, {Mode: WaitAdaptive, Spin: time.Microsecond}} {
		t.Run(cfg.Mode.String(), func(t *testing.T) {
			p, c := newRing(t, MinRingCapacity, cfg, cfg)
			progress := make(chan struct{}, 1)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				var b [8]byte
				for i := 0; i < n; i++ {
					binary.LittleEndian.PutUint64(b[:], uint64(i))
					if err := p.Write(0, b[:i%9], time.Time{}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				for i := 0; i < n; i++ {
					rec, err := c.Next(time.Time{})
					if err != nil {
						t.Error(err)
						return
					}
					var b [8]byte
					binary.LittleEndian.PutUint64(b[:], uint64(i))
					if !bytes.Equal(rec.Data, b[:i%9]) {
						t.Errorf("record %d: %x", i, rec.Data)
						return
					}
					c.Release()
					if i%1024 == 0 {
						select {
						case progress <- struct{}{}:
						default:
						}
					}
				}
			}()
			finished := make(chan struct{})
			go func() { wg.Wait(); close(finished) }()
			for {
				select {
				case <-finished:
					ps, cs := p.Stats(), c.Stats()
					t.Logf("producer %+v consumer %+v", ps, cs)
					if cs.Slept == 0 || ps.Slept == 0 {
						t.Errorf("the sleep path was not exercised")
					}
					return
				case <-progress:
				case <-time.After(20 * time.Second):
					err := errors.New("no progress for 20s: lost wake-up")
					pprof.Lookup("goroutine").WriteTo(os.Stderr, 2) // where each side waits
					fmt.Fprintf(os.Stderr, "hub: %s\nproducer waiter %+v\nconsumer waiter %+v\npBell %d cBell %d\n", p.waiter.hub.debugState(), p.waiter.debugState(), c.waiter.debugState(), load32(p.pBell), load32(c.cBell))
					p.Fail(err)
					c.Fail(err)
					<-finished
					t.Fatal(err)
				}
			}
		})
	}
}

// A consumer that declared it spins (SetSpinning), so that the producer
// publishes with release stores, and then sleeps all the same is woken by
// every commit: it takes the declaration back and fences for the producer
// before it re-checks (armBell). Record by record, the consumer declaring
// again before each wait, so that commits race the take-back, with and
// without a fence; a lost wake-up runs into the wait's deadline.
func TestSpinningConsumerThatSleeps(t *testing.T) {
	needParallel(t)
	p, c := newRing(t, MinRingCapacity, WaitConfig{Mode: WaitBlock}, WaitConfig{Mode: WaitBlock})
	if err := c.SetSpinning(); err != nil {
		t.Skipf("no global memory barriers here: %v", err)
	}
	n := 20_000
	if testing.Short() {
		n = 5_000
	}
	acks := make(chan struct{})
	relaxed := 0 // commits that found the declaration (release stores)
	errc := make(chan error, 1)
	go func() {
		var b [8]byte
		for i := range n {
			if i > 0 {
				<-acks
			}
			if p.fenceFree && load32(p.cSpins) != 0 {
				relaxed++
			}
			binary.LittleEndian.PutUint64(b[:], uint64(i))
			if err := p.Write(0, b[:], time.Time{}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := range n {
		rec, err := c.Next(time.Now().Add(10 * time.Second))
		if err != nil {
			t.Fatalf("record %d: %v (a lost wake-up)", i, err)
		}
		if got := binary.LittleEndian.Uint64(rec.Data); got != uint64(i) {
			t.Fatalf("record %d reads %d", i, got)
		}
		c.Release()
		if i < n-1 {
			// Declared before the producer goes on: its commit races
			// our next wait's take-back.
			if err := c.SetSpinning(); err != nil {
				t.Fatal(err)
			}
			acks <- struct{}{}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if cs := c.Stats(); cs.Slept == 0 || relaxed == 0 {
		t.Errorf("%d of %d commits without a fence, %d sleeps: the race was not exercised", relaxed, n, cs.Slept)
	}
	t.Logf("%d of %d commits without a fence; consumer %+v", relaxed, n, c.Stats())
}

// The take-back (armBell) as a litmus test: in each round the producer
// commits a record, with a release store when it still finds the
// declaration, and looks at the doorbell, while the consumer, at about
// the same moment, announces itself in the doorbell (taking the
// declaration back) and looks for the record. At least one of them must
// see the other's store, else the consumer would sleep through the
// record. (The barrier closes a window that x86 leaves open — a load may
// pass the thread's own earlier store — but that this test does not hit
// here without it: the take-back's own store to the control line, which
// the producer reads, takes longer than the producer's store to drain.)
func TestSpinningTakeBackFences(t *testing.T) {
	needParallel(t)
	p, c := newRing(t, 1<<12, WaitConfig{Mode: WaitBusyPoll}, WaitConfig{Mode: WaitBusyPoll})
	if err := c.SetSpinning(); err != nil {
		t.Skipf("no global memory barriers here: %v", err)
	}
	var sawBell, sawRecord bool
	lost := litmus(
		func(int) {
			if err := c.SetSpinning(); err != nil {
				t.Fatal(err)
			}
		},
		func(int) { // the producer
			if _, err := p.Reserve(8, time.Time{}); err != nil {
				panic(err)
			}
			wakes := p.stats.Wakes
			if err := p.Commit(0, 8); err != nil {
				panic(err)
			}
			sawBell = p.stats.Wakes != wakes
		},
		func(int) { // the consumer
			c.armBell(c.waiter.Bell())
			sawRecord = c.Pending()
		},
		func(i int) bool {
			c.armBell(0)
			if _, ok, err := c.Poll(); !ok || err != nil {
				t.Fatalf("round %d: the record is not there: %v", i, err)
			}
			c.Release()
			return !sawRecord && !sawBell
		})
	if lost > 0 {
		t.Fatalf("%d rounds: neither side saw the other's store (a lost wake-up)", lost)
	}
}

// needParallel skips a test that races two goroutines running at the
// same moment on two threads, each spinning for the other: with one
// processor (GOMAXPROCS=1) they take turns, the race is never run, and
// each turn waits for the scheduler to preempt the spinner.
func needParallel(t *testing.T) {
	t.Helper()
	if n := runtime.GOMAXPROCS(0); n < 2 {
		t.Skipf("needs two goroutines running at once; GOMAXPROCS is %d", n)
	}
}

// litmus runs rounds of two sequences racing on two threads, and counts
// the rounds that lost. In round i, setup runs on the test's thread;
// then a on a goroutine of its own and b on the test's thread, at about
// the same moment, each after a random short delay, so that the two
// overlap in some of the rounds whatever the hand-off between the cores;
// then, once both are done, lost on the test's thread judges the round.
// What a writes, the test's thread reads only after the round.
func litmus(setup, a, b func(i int), lost func(i int) bool) int {
	// Callers skip with one processor (needParallel): the two sides
	// spin for each other.
	rounds := 20_000
	if testing.Short() {
		rounds = 5_000
	}
	var round, done atomic.Int64
	delay := func(rng *rand.Rand) {
		for range rng.IntN(64) {
			round.Load()
		}
	}
	go func() {
		runtime.LockOSThread()
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range int64(rounds) {
			for round.Load() != i+1 {
			}
			delay(rng)
			a(int(i))
			done.Store(i + 1)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n := 0
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range int64(rounds) {
		setup(int(i))
		round.Store(i + 1)
		delay(rng)
		b(int(i))
		for done.Load() != i+1 {
		}
		if lost(int(i)) {
			n++
		}
	}
	return n
}

func TestCorruptRecords(t *testing.T) {
	cases := []struct {
		name string
		off  uint64
		hdr  uint64
	}{
		{"uncommitted bit", 0, 5},
		{"reserved bits", 0, hdrCommitted | 1<<50 | 4},
		{"too long", 0, hdrCommitted | 4000},
		{"straddles end", 0, hdrCommitted | 2000}, // maxPay is 2032 for 4096
		{"padding not to end", 0, hdrCommitted | hdrPadding | 100},
		{"huge length", 0, hdrCommitted | 0xffffffff},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, cons := newRing(t, 4096, WaitConfig{}, WaitConfig{})
			if c.name == "straddles end" {
				// Move to offset 3000 first, so 2000 bytes straddle.
				for i := 0; i < 3; i++ {
					if err := p.Write(0, make([]byte, 992), time.Time{}); err != nil {
						t.Fatal(err)
					}
					cons.Poll()
					cons.Release()
				}
				c.off = 3000
			}
			*at(cons.data, c.off) = c.hdr
			_, _, err := cons.Poll()
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Poll: %v, want ErrCorrupt", err)
			}
			*at(cons.data, c.off) = 0
			if _, _, err2 := cons.Poll(); !errors.Is(err2, ErrCorrupt) {
				t.Fatalf("consumer recovered from corruption: %v", err2)
			}
		})
	}
	t.Run("pending at the end", func(t *testing.T) {
		// A hostile length in the ring's last line: Pending, which looks
		// ahead of the reader at the record's further lines, must stay
		// inside the ring.
		p, cons := newRing(t, 4096, WaitConfig{}, WaitConfig{})
		for _, n := range []int{992, 992, 992, 1080} { // the head at 4088
			if err := p.Write(0, make([]byte, n), time.Time{}); err != nil {
				t.Fatal(err)
			}
			if _, ok, err := cons.Poll(); !ok || err != nil {
				t.Fatalf("record of %d: ok %v err %v", n, ok, err)
			}
			cons.Release()
		}
		if off := cons.headPos & cons.mask; off != 4088 {
			t.Fatalf("head at %d, want 4088", off)
		}
		*at(cons.data, 4088) = hdrCommitted | 1000 // past the end, under the prefetch bound
		if !cons.Pending() {
			t.Fatal("Pending: false with a header at the head")
		}
		if _, _, err := cons.Poll(); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Poll: %v, want ErrCorrupt", err)
		}
	})
	t.Run("head beyond tail", func(t *testing.T) {
		p, _ := newRing(t, 256, WaitConfig{Mode: WaitBusyPoll}, WaitConfig{})
		store64(p.head, 1<<40)
		var err error
		for i := 0; i < 100 && err == nil; i++ {
			err = p.Write(0, make([]byte, 64), time.Time{})
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("producer: %v, want ErrCorrupt", err)
		}
	})
	t.Run("overrun", func(t *testing.T) {
		// Headers that claim more than the capacity minus the gap beyond
		// what the consumer released: a producer overwriting unread data.
		_, c := newRing(t, 256, WaitConfig{}, WaitConfig{})
		*at(c.data, 0) = hdrCommitted | 104
		*at(c.data, 112) = hdrCommitted | hdrPadding | 136
		if _, ok, err := c.Poll(); !ok || err != nil {
			t.Fatalf("first record: ok %v err %v", ok, err)
		}
		if _, _, err := c.Poll(); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("consumer: %v, want ErrCorrupt", err)
		}
	})
}

func TestParseWaitMode(t *testing.T) {
	for _, m := range []WaitMode{WaitAdaptive, WaitBusyPoll, WaitBlock} {
		got, err := ParseWaitMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseWaitMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseWaitMode("spin"); err == nil {
		t.Error("unknown mode parsed")
	}
	if err := (WaitConfig{Spin: -1}).Validate(); err == nil {
		t.Error("negative spin validated")
	}
}

// TestAdaptiveSpinsWhileItPays: an adaptive wait spins while its waits
// are shorter than the spin on average; once they are long it parks at
// once but for one probe in probeEvery, and short waits bring the spin
// back.
func TestAdaptiveSpinsWhileItPays(t *testing.T) {
	s := NewWaitStrategy(WaitConfig{Mode: WaitAdaptive, Spin: 20 * time.Microsecond})
	for range 40 {
		s.learn(time.Millisecond) // waits much longer than the spin
	}
	if spun := spinsIn(&s, 2*probeEvery); spun != 2 {
		t.Fatalf("after long waits, %d spins in %d waits, want the 2 probes", spun, 2*probeEvery)
	}
	for range 40 {
		s.learn(time.Microsecond)
	}
	for i := range 2 {
		if d, _ := s.spins(); d == 0 {
			t.Fatalf("wait %d after short waits did not spin", i)
		}
	}
}

// TestAdaptiveStartsParked: a fresh adaptive strategy parks (but for the
// probes) until its waits have shown that they are short: 6 waits of a
// sixth of the bar, with the mean's weight of 1/8.
func TestAdaptiveStartsParked(t *testing.T) {
	const spin = 20 * time.Microsecond
	s := NewWaitStrategy(WaitConfig{Mode: WaitAdaptive, Spin: spin})
	if spun := spinsIn(&s, probeEvery); spun != 1 {
		t.Fatalf("a fresh strategy spun %d of its first %d waits, want the probe alone", spun, probeEvery)
	}
	short := spinPays * spin / 6
	for range 5 {
		s.learn(short)
	}
	if s.mean < spinPays*spin {
		t.Fatalf("mean %v under the bar after 5 short waits", s.mean)
	}
	s.learn(short)
	if d, _ := s.spins(); d == 0 {
		t.Fatalf("mean %v: no spin after 6 short waits", s.mean)
	}
}

// TestAdaptiveForgetsAnIdleSecond: a wait counts at most coldWaits bars
// in the mean, so that a connection that idled spins again after a few
// short waits.
func TestAdaptiveForgetsAnIdleSecond(t *testing.T) {
	const spin = 20 * time.Microsecond
	s := NewWaitStrategy(WaitConfig{Mode: WaitAdaptive, Spin: spin})
	for range 40 {
		s.learn(time.Microsecond)
	}
	s.learn(time.Second)
	if limit := coldWaits * spinPays * spin; s.mean > limit {
		t.Fatalf("mean %v after an idle second, want at most %v", s.mean, limit)
	}
	for range 6 {
		s.learn(time.Microsecond)
	}
	if s.mean >= spinPays*spin {
		t.Fatalf("mean %v over the bar 6 short waits after an idle second", s.mean)
	}
}

// TestAdaptiveSpinsThroughAWakeUp: waits a little longer than the spin —
// what two sides that both park see, each waiting for the other's
// wake-up — keep the spin, so that the two can find each other spinning;
// waits of more than two spins park but for the probes.
func TestAdaptiveSpinsThroughAWakeUp(t *testing.T) {
	const spin = 20 * time.Microsecond
	s := NewWaitStrategy(WaitConfig{Mode: WaitAdaptive, Spin: spin})
	for range 40 {
		s.learn(spin * 3 / 2) // a peer's wake-up, a bit longer than the spin
	}
	if spun := spinsIn(&s, 2*probeEvery); spun != 2*probeEvery {
		t.Fatalf("waits of 1.5 spins: %d spins in %d waits, want all", spun, 2*probeEvery)
	}
	for range 40 {
		s.learn(spin * 5 / 2)
	}
	if spun := spinsIn(&s, 2*probeEvery); spun != 2 {
		t.Fatalf("after waits of 2.5 spins, %d spins in %d waits, want the 2 probes", spun, 2*probeEvery)
	}
}

// TestAdaptiveSpinsPolitelyForLongWaits: with a Spin longer than
// TightSpin, short waits spin tightly up to TightSpin; waits under two
// long spins on average spin politely up to Spin; longer ones park but
// for the probes, which spin tightly. With the default Spin, waits of a
// few hundred microseconds park as before.
func TestAdaptiveSpinsPolitelyForLongWaits(t *testing.T) {
	const long = 300 * time.Microsecond
	s := NewWaitStrategy(WaitConfig{Mode: WaitAdaptive, Spin: long})
	for range 40 {
		s.learn(time.Microsecond)
	}
	if d, polite := s.spins(); d != TightSpin || polite {
		t.Fatalf("short waits: spin %v, polite %v; want %v, tight", d, polite, TightSpin)
	}
	for range 40 {
		s.learn(long * 2 / 3) // a 64 KiB gRPC call's wait for its answer
	}
	for i := range 2 * probeEvery {
		d, polite := s.spins()
		if probe := s.since == 0; probe && (d != TightSpin || polite) || !probe && (d != long || !polite) {
			t.Fatalf("wait %d of %v waits: spin %v, polite %v", i, long*2/3, d, polite)
		}
	}
	for range 40 {
		s.learn(time.Second)
	}
	if spun := spinsIn(&s, 2*probeEvery); spun != 2 {
		t.Fatalf("after long waits, %d spins in %d waits, want the 2 probes", spun, 2*probeEvery)
	}
	def := NewWaitStrategy(WaitConfig{})
	for range 40 {
		def.learn(long * 2 / 3)
	}
	if spun := spinsIn(&def, 2*probeEvery); spun != 2 {
		t.Fatalf("default Spin, waits of %v: %d spins in %d waits, want the 2 probes", long*2/3, spun, 2*probeEvery)
	}
}

// TestSpinYieldsToQueuedGoroutine: a spinning wait lets a goroutine
// queued behind it on its processor run at its next look at the clock,
// not a yield period later: with one processor, the goroutine that makes
// the condition true can only run when the spinner yields. Both spinning
// modes; it fails with the yield left to the period alone (checked).
func TestSpinYieldsToQueuedGoroutine(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, cfg := range []WaitConfig{{Mode: WaitBusyPoll}, {Mode: WaitAdaptive, Spin: time.Hour}} {
		var set atomic.Bool
		looks := 0
		x := readyFunc(func() bool { looks++; return set.Load() })
		go set.Store(true) // runnable, behind the spinner on the one processor
		s := NewWaitStrategy(cfg)
		for s.mean >= spinPays*TightSpin && cfg.Mode == WaitAdaptive {
			s.learn(0) // waits short enough to spin, with no probe needed
		}
		if o, err := s.Wait(x, nil, time.Time{}); err != nil || o != WaitedSpun {
			t.Fatalf("%v: %v, %v", cfg.Mode, o, err)
		}
		// The first clock look comes after SpinCheckEvery looks; the
		// runtime's own goroutines (the collector's) may take one more turn.
		if looks > 3*SpinCheckEvery {
			t.Fatalf("%v: %d looks before the queued goroutine ran, want at most %d (a period is %d)",
				cfg.Mode, looks, 3*SpinCheckEvery, SpinCheckEvery*yieldEvery)
		}
	}
}

// TestOthersRunnableAllocatesNothing: the spin's look at the scheduler
// allocates nothing.
func TestOthersRunnableAllocatesNothing(t *testing.T) {
	s := NewWaitStrategy(WaitConfig{})
	if n := testing.AllocsPerRun(100, func() { s.othersRunnable() }); n != 0 {
		t.Fatalf("othersRunnable allocates %v times", n)
	}
}

// spinsIn counts the waits among the next n that s spins.
func spinsIn(s *WaitStrategy, n int) int {
	spun := 0
	for range n {
		if d, _ := s.spins(); d > 0 {
			spun++
		}
	}
	return spun
}

// TestResetRing uses a ring until it has wrapped and both sides closed
// it, resets it, and uses it again: the new sides find it empty and open,
// and every record is the new one, however the old ones lay.
func TestResetRing(t *testing.T) {
	const capacity = 4096
	s, err := CreateSegment("ring", KindRings, SegmentHeaderSize+RingSize(capacity))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	region, err := s.Region(SegmentHeaderSize, RingSize(capacity))
	if err != nil {
		t.Fatal(err)
	}
	if err := InitZeroedRing(region, capacity); err != nil {
		t.Fatal(err)
	}
	use := func(round int, closeAtEnd bool) {
		t.Helper()
		p, err := NewProducer(region, WaitConfig{})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		c, err := NewConsumer(region, WaitConfig{})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if _, ok, err := c.Poll(); ok || err != nil {
			t.Fatalf("round %d: a new ring holds a record (%v) or fails: %v", round, ok, err)
		}
		// 100 records of 50–249 bytes wrap a 4 KiB ring several times;
		// each round lays them at other offsets.
		for i := range 100 {
			msg := bytes.Repeat([]byte{byte(round*100 + i)}, 50+(i*37+round*11)%200)
			if err := p.Write(uint16(round), msg, time.Time{}); err != nil {
				t.Fatalf("round %d record %d: %v", round, i, err)
			}
			rec, ok, err := c.Poll()
			if !ok || err != nil || rec.Tag != uint16(round) || !bytes.Equal(rec.Data, msg) {
				t.Fatalf("round %d record %d: ok %v err %v tag %d, %d bytes", round, i, ok, err, rec.Tag, len(rec.Data))
			}
			c.Release()
		}
		if closeAtEnd {
			p.Close()
			c.Close()
		}
	}
	use(1, true)
	if err := ResetRing(region, capacity); err != nil {
		t.Fatal(err)
	}
	use(2, false) // left mid-stream: positions, not zero, are reset too
	if err := ResetRing(region, capacity); err != nil {
		t.Fatal(err)
	}
	use(3, true)
	if err := ResetRing(region[:RingSize(capacity)-1], capacity); err == nil {
		t.Fatal("ResetRing accepted a region too short for the ring")
	}
}

// TestUnfencedReleaseWakes: a consumer that releases with a release store
// (its producer declared that it fences before it sleeps for space) and a
// producer that arms its doorbell and looks at the head, racing: in every
// round either the producer sees the released head or the consumer sees
// the doorbell and wakes it. Without the producer's global barrier in
// Arm, the consumer's doorbell load may pass its own head store and the
// producer's head load its own doorbell store, and both miss.
func TestUnfencedReleaseWakes(t *testing.T) {
	needParallel(t)
	p, c := newRing(t, 1<<12, WaitConfig{Mode: WaitBusyPoll}, WaitConfig{Mode: WaitBusyPoll})
	if !c.unfenced || load32(c.pFences) == 0 {
		t.Skip("no global memory barriers here: every release fences")
	}
	bell := p.waiter.Bell()
	var sawHead, woke bool
	lost := litmus(
		func(i int) { // a record to release
			if _, err := p.Reserve(8, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if err := p.Commit(0, 8); err != nil {
				t.Fatal(err)
			}
			if _, ok, err := c.Poll(); !ok || err != nil {
				t.Fatalf("round %d: the record is not there: %v", i, err)
			}
		},
		func(int) { // the producer, about to sleep for space
			before := p.headCache
			(*spaceWait)(p).Arm(bell)
			sawHead = load64(p.head) != before
			if err := p.refreshHead(); err != nil {
				panic(err)
			}
		},
		func(int) { // the consumer
			wakes := c.stats.Wakes
			c.Release()
			woke = c.stats.Wakes != wakes
		},
		func(int) bool {
			store32(p.pBell, 0) // the next round arms afresh
			return !sawHead && !woke
		})
	if lost > 0 {
		t.Fatalf("%d rounds: neither side saw the other's store (a lost wake-up)", lost)
	}
}
