package sockets

import (
	"slices"
	"time"
)

// The choices of a large write's path, as pure functions of what the
// connection knows (UCX chooses its protocols so, and tests the choice as
// a table): whether a rendezvous source is copied into temporary memory
// or registered in place, and whether a transfer is offered, or taken, as
// a split. The connection gathers the facts (chooseSourceLocked,
// offerSplitLocked, acceptSplitLocked); policy_test.go is the table.

// sourceFacts is what the choice of a rendezvous source is made from.
type sourceFacts struct {
	n               int         // bytes of the rendezvous
	mode            ZeroCopy    // Config.ZeroCopy
	copyThreshold   int         // Config.CopyThreshold
	zeroCopyMax     int         // Config.ZeroCopyMax
	maxCopyInFlight int         // Config.MaxCopyInFlight
	copyInFlight    int         // copied bytes the peer has not taken yet
	bigWrite        bool        // larger than half the pinning budget (lowmem.go)
	peerRead        bool        // the peer RDMA-Reads: a read rendezvous
	deadline        bool        // a write deadline is set
	shared          bool        // the source is AllocBuffer memory, which the peer maps
	split           bool        // offered as a split transfer
	peerStages      bool        // the peer's last done said it read through staging
	reused          bool        // the previous large write's buffer
	learnedZC       bool        // the connection's measurements favour zero copy for this write (sourceLearner)
	cached          func() bool // in the registration cache (asked last: a lookup)
}

// sourceWhy says what decided a source choice, for the counters.
type sourceWhy uint8

const (
	whyConfig     sourceWhy = iota // Config.ZeroCopy, or nothing in particular
	whyBigWrite                    // copied: too large to pin (Counters.Fallbacks)
	whyShared                      // zero copy: AllocBuffer memory (Counters.ZeroShared)
	whyPeerStages                  // copied: the peer stages (Counters.CopyPeerStages)
	whyNewBuffer                   // copied: new to the cache (Counters.CopyNewBuffer)
)

// chooseSource tells whether the source of a rendezvous is copied into
// temporary memory (true; the write returns once the copy is made and the
// rts sent) or registered in place (false; no copy, the write waits until
// the peer has taken the data), and why.
func chooseSource(f *sourceFacts) (copied bool, why sourceWhy) {
	if f.bigWrite {
		return true, whyBigWrite
	}
	switch f.mode {
	case ZeroCopyAlways:
		return false, whyConfig
	case ZeroCopyNever:
		return true, whyConfig
	}
	switch {
	case !f.peerRead:
		// Write rendezvous: the write waits for the peer's sink anyway,
		// and a deadline cancels it cleanly; a copy would gain nothing.
		return false, whyConfig
	case f.deadline:
		// A deadline can end a write whose data is copied; a zero-copy
		// write that the peer has not taken would have to abort.
		return true, whyConfig
	case f.n < f.copyThreshold:
		// Small: a round trip per write costs more than the copy, and
		// the write returns at once.
		return true, whyConfig
	case f.shared:
		// The peer maps it and reads it in place, one copy in all, at
		// any size — faster than any copy into temporary memory, which
		// the peer would copy out again.
		return false, whyShared
	case f.split:
		// The peer reads half of our buffer while we write the other
		// half into its, each side one copy of half the bytes.
		return false, whyConfig
	case !f.learnedZC && (f.zeroCopyMax == 0 || f.n > f.zeroCopyMax):
		// Copies in CopyChunk pieces pipeline: we copy a piece while the
		// peer takes the one before, faster than the peer's
		// cross-memory read of our buffer (docs/performance.md, "Copy
		// or zero copy") — unless, for a write the reader waits for,
		// this connection measured otherwise (sourceLearner).
		return true, whyConfig
	case f.copyInFlight > 0 && f.copyInFlight+f.n > f.maxCopyInFlight:
		// The peer is behind: a copy would not let the write return
		// early, it would wait for the peer all the same.
		return false, whyConfig
	case f.peerStages:
		// Our buffer would reach the application through the peer's
		// staging buffer anyway, and a copy lets the write return early.
		return true, whyPeerStages
	case !f.reused && (f.cached == nil || !f.cached()):
		// New to the registration cache, and not the previous write's:
		// pinning it would cost more than copying it (docs/performance.md)
		// and the application may never write from it again.
		return true, whyNewBuffer
	}
	// In the zero-copy band: the peer pulls straight from our buffer.
	return false, whyConfig
}

// splitOfferFacts is what the decision to offer a read rendezvous as a
// split transfer is made from (Config.SplitMin).
type splitOfferFacts struct {
	n          int
	version    uint16 // the session protocol version in use
	splitMin   int
	mode       ZeroCopy
	deadline   bool
	peerStages bool
	now, until time.Time // no offer before until: the peer left the last one unsplit
	reused     bool
	cached     func() bool
	shared     bool
	bigWrite   bool
}

// offerSplit tells whether a read rendezvous registered in place may be
// offered split — if its source is in huge pages, which the caller asks
// the kernel last (hugeLocked): the peer speaks version 3 and split our
// last offer, its Reads are large, the source is at least SplitMin, and
// the application writes from it again (collapsing a buffer into huge
// pages once costs about a copy of it, and pays off only if it is used
// again).
func offerSplit(f *splitOfferFacts) bool {
	switch {
	case f.version < 3 || f.splitMin < 0 || f.n < f.splitMin || f.mode == ZeroCopyNever:
		return false
	case f.deadline || f.peerStages || f.now.Before(f.until):
		return false // a deadline: copy (chooseSource)
	case f.shared || f.bigWrite:
		return false // the peer maps it (one copy already), or it is copied (lowmem.go)
	case !f.reused && (f.cached == nil || !f.cached()):
		return false
	}
	return true
}

// acceptSplit tells whether we take a transfer the sender offered split
// into a Read buffer of n bytes — if it is in huge pages, which the caller
// asks last (the sender's cross-process write pins our pages one by one):
// the buffer is at least SplitMin and reused (inside the last direct
// Read's buffer, or in the registration cache: collapsing a new buffer
// costs more than the split saves).
func acceptSplit(n, splitMin int, reused bool, cached func() bool) bool {
	return splitMin > 0 && n >= splitMin && (reused || cached != nil && cached())
}

// sourceLearner chooses, for the large writes that a reader waits for
// (request and answer: no copy of ours in flight when the write starts),
// between the two ways a read rendezvous's source can go, from how long
// each took on this connection: copied in pieces, which the writer and the
// reader copy one after the other, pipelined (two copies of every byte),
// or registered in place and read by the peer in one cross-process copy.
// Which is faster depends on the host and on the application, not on the
// size alone: the pieces won on one kind of host, the single read on
// another — when the source was not just written by the other side of
// the connection's own copy, as an echo's is (docs/performance.md, "Copy
// or zero copy, learned"). So it measures the
// time from a write's start to the peer's done for its last piece, per
// byte: a block of learnBlock writes each way, the median of each block
// deciding (the first write of a buffer pins it, and a host's hiccups
// come and go), then the faster way for learnRun writes, then both again.
type sourceLearner struct {
	zc      bool                // the way asked for now
	explore int                 // 0: running the faster way; 1, 2: measuring copied, then zero copy
	k       int                 // writes of this block or run so far
	asked   int                 // writes asked for since this measuring began
	run     int                 // the run's length
	got     [learnBlock]float64 // the block's samples, ns per KiB
	med     [2]float64          // the last blocks' medians: copied, zero copy
}

// Learning parameters.
const (
	learnBlock  = 8    // writes measured each way in a row
	learnRun    = 256  // writes the faster way then goes, before both are measured again
	learnRunFar = 1024 // the same when the slower way took 1.5× the faster's time or more
)

// zeroCopy tells whether the next waited write should go zero copy.
func (l *sourceLearner) zeroCopy() bool {
	if l.explore == 0 {
		if l.k++; l.k > l.run {
			l.explore, l.k, l.asked, l.zc = 1, 0, 0, false // measure again: copied first
		}
	} else if l.asked++; l.asked > 4*learnBlock {
		// The writes do not go the way asked for (the facts overrule
		// it: a new buffer each time, a deadline): copied, as before,
		// and measured again later.
		l.explore, l.k, l.run, l.zc = 0, 0, learnRunFar, false
	}
	return l.zc
}

// record adds a write of n bytes that went the way asked for and took d
// from its start to the peer's last done.
func (l *sourceLearner) record(zc bool, d time.Duration, n int) {
	if l.explore == 0 || zc != l.zc || n <= 0 || d <= 0 {
		return
	}
	l.got[l.k] = float64(d) / float64(n) * 1024
	if l.k++; l.k < learnBlock {
		return
	}
	g := l.got
	slices.Sort(g[:])
	m := (g[learnBlock/2-1] + g[learnBlock/2]) / 2
	if l.explore == 1 {
		l.med[0] = m
		l.explore, l.k, l.asked, l.zc = 2, 0, 0, true
		return
	}
	l.med[1] = m
	l.zc = l.med[1] < l.med[0]
	l.explore, l.k, l.run = 0, 0, learnRun
	if hi, lo := max(l.med[0], l.med[1]), min(l.med[0], l.med[1]); hi >= 1.5*lo {
		l.run = learnRunFar
	}
}

// learnableLocked tells whether the write of b, which found no copy of
// ours in flight, is one the source learner chooses for and measures: a
// read rendezvous whose source either way could take (the switch left to
// the connection, with no zero-copy band set: ZeroCopyMax 0; no
// deadline, not too large to pin, not a buffer the peer maps, short of a
// split transfer's size).
func (c *Conn) learnableLocked(b []byte) bool {
	n := len(b) - c.maxPayload
	return c.cfg.ZeroCopy == ZeroCopyAuto && c.cfg.ZeroCopyMax == 0 && c.peerRead && !c.bigWrite &&
		n >= c.cfg.CopyThreshold && (c.cfg.SplitMin <= 0 || len(b) < c.cfg.SplitMin) &&
		!c.wdl.isSet.Load() && !c.sharedSource(b)
}
