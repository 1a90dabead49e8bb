package sockets

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// TestChooseSource is the source choice as a table: each row changes one
// fact from a write in the zero-copy band (a reused buffer of 512 KiB,
// read rendezvous, ZeroCopyMax 1 MiB) and says which way it must go.
func TestChooseSource(t *testing.T) {
	base := func() sourceFacts {
		return sourceFacts{
			n: 512 << 10, mode: ZeroCopyAuto, copyThreshold: 256 << 10, zeroCopyMax: 1 << 20,
			maxCopyInFlight: 4 << 20, peerRead: true, reused: true,
		}
	}
	cached := func(v bool) func() bool { return func() bool { return v } }
	for _, tc := range []struct {
		name   string
		change func(f *sourceFacts)
		copied bool
		why    sourceWhy
	}{
		{"zero-copy band", func(f *sourceFacts) {}, false, whyConfig},
		{"too large to pin", func(f *sourceFacts) { f.bigWrite = true; f.mode = ZeroCopyAlways }, true, whyBigWrite},
		{"always", func(f *sourceFacts) { f.mode = ZeroCopyAlways; f.deadline = true }, false, whyConfig},
		{"never", func(f *sourceFacts) { f.mode = ZeroCopyNever; f.shared = true }, true, whyConfig},
		{"write rendezvous", func(f *sourceFacts) { f.peerRead = false; f.deadline = true }, false, whyConfig},
		{"deadline", func(f *sourceFacts) { f.deadline = true; f.shared = true }, true, whyConfig},
		{"small", func(f *sourceFacts) { f.n = 64 << 10; f.shared = true }, true, whyConfig},
		{"shared buffer", func(f *sourceFacts) { f.shared = true; f.reused = false }, false, whyShared},
		{"split", func(f *sourceFacts) { f.split = true; f.zeroCopyMax = 0 }, false, whyConfig},
		{"pieces pipeline (default ZeroCopyMax)", func(f *sourceFacts) { f.zeroCopyMax = 0 }, true, whyConfig},
		{"learned zero copy", func(f *sourceFacts) { f.zeroCopyMax = 0; f.learnedZC = true }, false, whyConfig},
		{"learned zero copy, above ZeroCopyMax", func(f *sourceFacts) { f.n = 2 << 20; f.learnedZC = true }, false, whyConfig},
		{"learned zero copy, deadline", func(f *sourceFacts) { f.zeroCopyMax = 0; f.learnedZC = true; f.deadline = true }, true, whyConfig},
		{"learned zero copy, new buffer", func(f *sourceFacts) {
			f.zeroCopyMax = 0
			f.learnedZC = true
			f.reused = false
			f.cached = cached(false)
		}, true, whyNewBuffer},
		{"learned zero copy, never", func(f *sourceFacts) { f.learnedZC = true; f.mode = ZeroCopyNever }, true, whyConfig},
		{"above ZeroCopyMax", func(f *sourceFacts) { f.n = 2 << 20 }, true, whyConfig},
		{"peer behind", func(f *sourceFacts) { f.copyInFlight = 4 << 20; f.peerStages = true }, false, whyConfig},
		{"peer stages", func(f *sourceFacts) { f.peerStages = true }, true, whyPeerStages},
		{"new buffer", func(f *sourceFacts) { f.reused = false; f.cached = cached(false) }, true, whyNewBuffer},
		{"cached buffer", func(f *sourceFacts) { f.reused = false; f.cached = cached(true) }, false, whyConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := base()
			tc.change(&f)
			if copied, why := chooseSource(&f); copied != tc.copied || why != tc.why {
				t.Fatalf("chooseSource = copied %v (why %d), want %v (why %d)", copied, why, tc.copied, tc.why)
			}
		})
	}
}

// TestSplitChoices: the offer and the acceptance of split transfers as
// tables, from a reused 4 MiB buffer on a version 3 connection.
func TestSplitChoices(t *testing.T) {
	now := time.Now()
	base := func() splitOfferFacts {
		return splitOfferFacts{n: 4 << 20, version: 3, splitMin: 2 << 20, mode: ZeroCopyAuto, now: now, reused: true}
	}
	for _, tc := range []struct {
		name   string
		change func(f *splitOfferFacts)
		offer  bool
	}{
		{"offered", func(f *splitOfferFacts) {}, true},
		{"version 2", func(f *splitOfferFacts) { f.version = 2 }, false},
		{"never split", func(f *splitOfferFacts) { f.splitMin = -1 }, false},
		{"below SplitMin", func(f *splitOfferFacts) { f.n = 1 << 20 }, false},
		{"ZeroCopyNever", func(f *splitOfferFacts) { f.mode = ZeroCopyNever }, false},
		{"deadline", func(f *splitOfferFacts) { f.deadline = true }, false},
		{"peer stages", func(f *splitOfferFacts) { f.peerStages = true }, false},
		{"peer declined lately", func(f *splitOfferFacts) { f.until = now.Add(time.Second) }, false},
		{"declined long ago", func(f *splitOfferFacts) { f.until = now.Add(-time.Second) }, true},
		{"shared buffer", func(f *splitOfferFacts) { f.shared = true }, false},
		{"too large to pin", func(f *splitOfferFacts) { f.bigWrite = true }, false},
		{"new buffer", func(f *splitOfferFacts) { f.reused = false }, false},
		{"cached buffer", func(f *splitOfferFacts) { f.reused = false; f.cached = func() bool { return true } }, true},
	} {
		t.Run("offer/"+tc.name, func(t *testing.T) {
			f := base()
			tc.change(&f)
			if got := offerSplit(&f); got != tc.offer {
				t.Fatalf("offerSplit = %v, want %v", got, tc.offer)
			}
		})
	}
	yes := func() bool { return true }
	for _, tc := range []struct {
		name     string
		n, min   int
		reused   bool
		cached   func() bool
		accepted bool
	}{
		{"reused", 4 << 20, 2 << 20, true, nil, true},
		{"cached", 4 << 20, 2 << 20, false, yes, true},
		{"new", 4 << 20, 2 << 20, false, func() bool { return false }, false},
		{"small", 1 << 20, 2 << 20, true, yes, false},
		{"never split", 4 << 20, -1, true, yes, false},
	} {
		t.Run("accept/"+tc.name, func(t *testing.T) {
			if got := acceptSplit(tc.n, tc.min, tc.reused, tc.cached); got != tc.accepted {
				t.Fatalf("acceptSplit = %v, want %v", got, tc.accepted)
			}
		})
	}
}

// TestCopyChunk is the size of a copied write's pieces as a table: a write
// the reader waits for (none of our copies in flight when it began) goes
// in pieces of at most WaitedChunk, so that the reader copies one out
// while the writer copies the next; a stream keeps CopyChunk; a write far
// larger than the caches takes 2 MiB pieces either way.
func TestCopyChunk(t *testing.T) {
	d := DefaultConfig()
	chunk, waited, inFlight := d.CopyChunk, d.WaitedChunk, d.MaxCopyInFlight
	for _, c := range []struct {
		name          string
		rest          int
		chunk, waited int
		isWaited      bool
		want          int
	}{
		{"stream 1 MiB", 1 << 20, chunk, waited, false, chunk},
		{"waited 1 MiB", 1 << 20, chunk, waited, true, waited},
		{"waited, small CopyChunk", 1 << 20, 64 << 10, waited, true, 64 << 10},
		{"waited, WaitedChunk off", 1 << 20, chunk, -1, true, chunk},
		{"stream 16 MiB", 16 << 20, chunk, waited, false, 2 << 20},
		{"waited 16 MiB", 16 << 20, chunk, waited, true, 2 << 20},
	} {
		if got := copyChunk(c.rest, c.chunk, inFlight, c.waited, c.isWaited); got != c.want {
			t.Errorf("%s: piece of %d, want %d", c.name, got, c.want)
		}
	}
}

// TestSourceLearner: a block of writes copied, then a block zero copy,
// the faster way by the blocks' medians for a run, then both measured
// again; a slower way far behind waits longer; a block whose writes go
// another way than asked gives up. Each step fails if the learner takes a
// way its measurements do not favour.
func TestSourceLearner(t *testing.T) {
	const n = 1 << 20
	us := func(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }
	// block feeds one block of writes: each asked, then recorded as
	// taking d (one outlier, the first write of a buffer, 10×).
	block := func(l *sourceLearner, want bool, d time.Duration) {
		t.Helper()
		for i := range learnBlock {
			if got := l.zeroCopy(); got != want {
				t.Fatalf("write %d of the block: zero copy %v, want %v", i, got, want)
			}
			dd := d
			if i == 0 {
				dd = 10 * d
			}
			l.record(want, dd, n)
		}
	}
	var l sourceLearner
	block(&l, false, us(80)) // copied first
	block(&l, true, us(60))  // then zero copy: faster
	for i := range learnRun {
		if !l.zeroCopy() {
			t.Fatalf("write %d of the run: copied, though zero copy measured faster", i)
		}
		l.record(true, us(60), n) // outside a block: no effect
	}
	block(&l, false, us(70)) // measured again: now the copy is faster
	block(&l, true, us(80))
	if l.zeroCopy() {
		t.Fatal("zero copy after it measured slower")
	}
	if l.run != learnRun {
		t.Fatalf("run of %d writes for a 1.14× difference, want %d", l.run, learnRun)
	}
	for range learnRun - 1 {
		l.zeroCopy()
	}
	block(&l, false, us(50))
	block(&l, true, us(100)) // 2×: a longer run before the next measuring
	if l.run != learnRunFar {
		t.Fatalf("run of %d writes for a 2× difference, want %d", l.run, learnRunFar)
	}
	for range learnRunFar {
		if l.zeroCopy() {
			t.Fatal("zero copy in the run after it measured 2× slower")
		}
	}
	// Measuring again, the zero-copy block's writes go copied (the
	// facts overrule it: record is not called for them): it gives up.
	block(&l, false, us(50))
	for range 4 * learnBlock {
		if !l.zeroCopy() {
			t.Fatal("gave up measuring zero copy too soon")
		}
	}
	if l.zeroCopy() {
		t.Fatal("still asking for zero copy after a block's worth of writes went another way four times over")
	}
	// Samples of the other way, or of nothing, change nothing.
	before := l
	l.record(true, us(1), n)
	l.record(false, 0, n)
	if l != before {
		t.Fatal("a sample outside a measuring block changed the learner")
	}
}

// TestSourceLearnedOnConnection: 1 MiB writes that the reader waits for
// (an echo, one at a time, from buffers the application reuses) go by
// both ways while the connection measures them — a block copied, then a
// block zero copy — and every byte arrives; then the learner has a
// median for each way and goes on with one of them. It fails if waited
// writes never try zero copy (the default before: copies only), or if
// either way loses or reorders bytes.
func TestSourceLearnedOnConnection(t *testing.T) {
	c, s := pipe(t, nil, nil)
	const size = 1 << 20
	go func() {
		in, out := make([]byte, size), make([]byte, size)
		for {
			if _, err := io.ReadFull(s, in); err != nil {
				return
			}
			copy(out, in) // answered from a buffer of its own
			if _, err := s.Write(out); err != nil {
				return
			}
		}
	}()
	out, in := make([]byte, size), make([]byte, size)
	rounds := 2*learnBlock + 4
	for i := range rounds {
		for j := range out {
			out[j] = byte(i*31 + j*7)
		}
		if _, err := c.Write(out); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("round %d: the echo differs", i)
		}
	}
	st := c.(*Conn).Stats()
	if st.ZeroChosen < learnBlock || st.CopyChosen < learnBlock {
		t.Fatalf("waited writes went zero copy %d times and copied %d: the learner did not measure both ways", st.ZeroChosen, st.CopyChosen)
	}
	cc := c.(*Conn)
	cc.mu.Lock()
	l := cc.learn
	cc.mu.Unlock()
	if l.explore != 0 || l.med[0] <= 0 || l.med[1] <= 0 {
		t.Fatalf("after %d waited writes the learner is measuring still (%d) or lacks a median (copied %.0f, zero copy %.0f ns/KiB)",
			rounds, l.explore, l.med[0], l.med[1])
	}
	t.Logf("copied %.0f ns/KiB, zero copy %.0f ns/KiB: zero copy next %v", l.med[0], l.med[1], l.zc)
}
