package pin

import (
	"slices"

	"github.com/sandirect/sandirect/internal/sys"
)

// span is a page-aligned address range [lo, hi).
type span struct{ lo, hi uintptr }

func (s span) len() uintptr { return s.hi - s.lo }

var pageMask = uintptr(sys.PageSize - 1)

// pageSpan returns the page-aligned superset of [addr, addr+n). n > 0 and
// addr+n does not overflow.
func pageSpan(addr, n uintptr) span {
	return span{addr &^ pageMask, (addr + n + pageMask) &^ pageMask}
}

// seg is a run of pages with the same pin count n > 0.
type seg struct {
	lo, hi uintptr
	n      int32
}

// pinTable keeps per-page pin counts as sorted, non-overlapping runs, and
// makes the system calls when a page's count leaves or reaches zero:
// mlock and MADV_DONTFORK at 0→1, munlock, MADV_DOFORK and the monitor's
// unwatch at 1→0. mlock does not nest, so this count is what keeps one
// registration's unpin from undoing another's lock.
//
// Not safe for concurrent use: the Cache's mu guards it.
type pinTable struct {
	segs    []seg
	bytes   uintptr // pages with n > 0, in bytes
	scratch []seg
	gaps    []span
	unwatch func(lo, hi uintptr)
}

// search returns the index of the first run ending after lo.
func (t *pinTable) search(lo uintptr) int {
	i, j := 0, len(t.segs)
	for i < j {
		m := int(uint(i+j) >> 1)
		if t.segs[m].hi <= lo {
			i = m + 1
		} else {
			j = m
		}
	}
	return i
}

// unpinned returns the parts of s with a zero count, in t.gaps (valid until
// the next call).
func (t *pinTable) unpinned(s span) []span {
	t.gaps = t.gaps[:0]
	cur := s.lo
	for i := t.search(s.lo); i < len(t.segs) && t.segs[i].lo < s.hi; i++ {
		if t.segs[i].lo > cur {
			t.gaps = append(t.gaps, span{cur, t.segs[i].lo})
		}
		cur = t.segs[i].hi
	}
	if cur < s.hi {
		t.gaps = append(t.gaps, span{cur, s.hi})
	}
	return t.gaps
}

// unpinnedBytes returns how many bytes of s pinning would newly lock.
func (t *pinTable) unpinnedBytes(s span) uintptr {
	var n uintptr
	for _, g := range t.unpinned(s) {
		n += g.len()
	}
	return n
}

// pin adds one to the count of every page of s, locking the pages that had
// none. On error nothing has changed.
func (t *pinTable) pin(s span) error {
	gaps := t.unpinned(s)
	for k, g := range gaps {
		if err := sys.Mlock(g.lo, g.len()); err != nil {
			for _, u := range gaps[:k] {
				sys.Madvise(u.lo, u.len(), sys.MadvDofork)
				sys.Munlock(u.lo, u.len())
			}
			return err
		}
		// Best effort: a forked child must not share (or copy-on-write
		// away) pages the NIC reads and writes.
		sys.Madvise(g.lo, g.len(), sys.MadvDontfork)
		t.bytes += g.len()
	}
	t.add(s, 1)
	return nil
}

// add adds d (+1 or -1) to the count of every page of s and returns, in
// t.gaps, the runs whose count reached zero (d = -1 only). Pages of s without
// a run are skipped when d < 0 and get a new run when d > 0.
func (t *pinTable) add(s span, d int32) []span {
	i := t.search(s.lo)
	j := i
	out := t.scratch[:0]
	t.gaps = t.gaps[:0]
	cur := s.lo
	for ; j < len(t.segs) && t.segs[j].lo < s.hi; j++ {
		r := t.segs[j]
		if r.lo < s.lo {
			out = append(out, seg{r.lo, s.lo, r.n})
			r.lo = s.lo
		}
		if d > 0 && cur < r.lo {
			out = append(out, seg{cur, r.lo, d})
		}
		hi := min(r.hi, s.hi)
		if n := r.n + d; n > 0 {
			out = append(out, seg{r.lo, hi, n})
		} else if k := len(t.gaps); k > 0 && t.gaps[k-1].hi == r.lo {
			t.gaps[k-1].hi = hi
		} else {
			t.gaps = append(t.gaps, span{r.lo, hi})
		}
		if r.hi > s.hi {
			out = append(out, seg{s.hi, r.hi, r.n})
		}
		cur = hi
	}
	if d > 0 && cur < s.hi {
		out = append(out, seg{cur, s.hi, d})
	}
	// Coalesce equal neighbours so the table stays as small as the
	// registrations are distinct.
	if i > 0 {
		i--
		out = append(out, seg{})
		copy(out[1:], out)
		out[0] = t.segs[i]
	}
	if j < len(t.segs) {
		out = append(out, t.segs[j])
		j++
	}
	w := 0
	for _, r := range out {
		if w > 0 && out[w-1].hi == r.lo && out[w-1].n == r.n {
			out[w-1].hi = r.hi
			continue
		}
		out[w] = r
		w++
	}
	t.segs = slices.Replace(t.segs, i, j, out[:w]...)
	t.scratch = out[:0]
	for _, g := range t.gaps {
		t.bytes -= g.len()
	}
	return t.gaps
}

// unpin subtracts one from the count of every page of s except those in
// holes (ranges already reported unmapped, whose counts were dropped), and
// unlocks the pages whose count reached zero.
func (t *pinTable) unpin(s span, holes []span) {
	if len(holes) == 0 {
		t.release(t.add(s, -1))
		return
	}
	// s minus holes, piece by piece.
	holes = slices.Clone(holes)
	slices.SortFunc(holes, func(a, b span) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	cur := s.lo
	for _, h := range holes {
		if h.lo > cur {
			t.release(t.add(span{cur, min(h.lo, s.hi)}, -1))
		}
		cur = max(cur, h.hi)
		if cur >= s.hi {
			return
		}
	}
	if cur < s.hi {
		t.release(t.add(span{cur, s.hi}, -1))
	}
}

func (t *pinTable) release(freed []span) {
	for _, g := range freed {
		sys.Madvise(g.lo, g.len(), sys.MadvDofork)
		sys.Munlock(g.lo, g.len())
		if t.unwatch != nil {
			t.unwatch(g.lo, g.len())
		}
	}
}

// drop forgets every count in s without a system call: the range was
// unmapped (or replaced), and whatever is mapped there now is not ours to
// unlock.
func (t *pinTable) drop(s span) {
	i := t.search(s.lo)
	j := i
	out := t.scratch[:0]
	for ; j < len(t.segs) && t.segs[j].lo < s.hi; j++ {
		r := t.segs[j]
		if r.lo < s.lo {
			out = append(out, seg{r.lo, s.lo, r.n})
		}
		if r.hi > s.hi {
			out = append(out, seg{s.hi, r.hi, r.n})
		}
		t.bytes -= min(r.hi, s.hi) - max(r.lo, s.lo)
	}
	t.segs = slices.Replace(t.segs, i, j, out...)
	t.scratch = out[:0]
}
