package sockets

import (
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
)

// pieceCopier copies the pieces of copied rendezvous into temporary memory
// either through the caches (mem.CopyShared) or around them (mem.CopyNT), whichever
// has been faster lately on this device.
//
// Which is faster depends on where the machine puts the two processes'
// cores, and on a VM that can change from minute to minute. When a cache
// line passes between them quickly, the reader finds a cached piece in
// our cache; when the host put the vCPUs far apart, the writer's cached
// stores must first take every line back from the reader's cache, while
// non-temporal stores need no line read in (docs/protocol.md, "Copied
// pieces"; the figures are in docs/performance.md).
//
// Our copy's own speed does not tell the two cases apart — non-temporal
// stores are always fast for the writer, and leave the reader to fetch
// the piece from memory — so a piece's cost is the longer of our copy and
// the reader's time on it (from when it could start, the rts sent or the
// previous done, to its done). Nor does one piece: a cached piece after
// non-temporal ones finds its buffer in no cache. So the ways are measured
// in runs: after a change of way the first warmBytes are not counted; the
// way with the lower cost per byte is used, and every copierRetry the
// other gets a run of warmBytes+trialBytes.
type pieceCopier struct {
	mu    lockrank.Mutex
	rate  [2]float64   // moving average, bytes per ns: [0] copy, [1] non-temporal
	tried [2]time.Time // when each way's last run began
	way   int          // the way of the last piece
	run   int          // bytes in a row in that way, before this piece
	trial int          // bytes left in a trial run of the other way
}

const (
	// ntMinPiece: smaller pieces always go through the caches; a reader
	// takes them at once.
	ntMinPiece = 32 << 10
	// warmBytes after a change of way are not counted: the temporary
	// buffers the pieces cycle through (up to MaxCopyInFlight, 4 MiB by
	// default) are not yet where that way leaves them.
	warmBytes  = 8 << 20
	trialBytes = 4 << 20
	// copierRetry is how often the slower way is measured again: rarely
	// enough that its trial runs cost little of a stream, often enough to
	// follow a placement change within a second.
	copierRetry = 250 * time.Millisecond
)

// copy copies src, the application's buffer, into dst (as long). For a
// piece of at least ntMinPiece bytes it reports the way it took and, if
// the piece is to be counted, how long the copy took: the caller then
// records the piece's cost once the reader is done with it. A fault in src
// is a faultError (copyGuarded).
func (p *pieceCopier) copy(dst, src []byte) (nt bool, d time.Duration, err error) {
	if len(src) < ntMinPiece {
		_, err = copyGuarded(dst, src, src, "write", false)
		return false, 0, err
	}
	start := time.Now()
	nt, count := p.choose(start, len(src))
	if _, err = copyGuarded(dst, src, src, "write", nt); err != nil || !count {
		return nt, 0, err
	}
	return nt, max(time.Since(start), 1), nil
}

// choose picks the way for a piece of n bytes starting at now, and
// whether its cost counts.
func (p *pieceCopier) choose(now time.Time, n int) (nt, count bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	way := p.way
	switch {
	case p.trial > 0:
		p.trial -= n
	case p.tried[0].IsZero() || p.tried[1].IsZero():
		// Measure each way once, cached first.
		way = 0
		if !p.tried[0].IsZero() {
			way = 1
		}
		p.tried[way] = now
		p.trial = warmBytes + trialBytes - n
	default:
		fast := 0
		if p.rate[1] > p.rate[0] {
			fast = 1
		}
		way = fast
		if slow := 1 - fast; now.Sub(p.tried[slow]) >= copierRetry {
			way = slow
			p.tried[slow] = now
			p.trial = warmBytes + trialBytes - n
		}
	}
	if way != p.way {
		p.way, p.run = way, 0
	}
	count = p.run >= warmBytes
	p.run += n
	return way == 1, count
}

// record folds the cost d of a piece of n bytes into its way's average.
// A piece costs the longer of its two halves in the pipeline: our copy,
// and the reader's time on it (see Conn.onDoneLocked).
func (p *pieceCopier) record(nt bool, n int, d time.Duration) {
	way := 0
	if nt {
		way = 1
	}
	r := float64(n) / float64(max(d, 1))
	p.mu.Lock()
	if p.rate[way] == 0 {
		p.rate[way] = r
	} else {
		p.rate[way] += (r - p.rate[way]) / 4
	}
	p.mu.Unlock()
}
