package pin

import "slices"

// index is the ordered set of cached entries: non-overlapping page ranges
// sorted by start, kept as two parallel sorted arrays searched by bisection.
//
// Why not a B-tree: the B-trees we measured took several times longer per
// lookup than bisection over a []uintptr of starts, which fits a cache
// hit's budget (docs/performance.md, "pin"). Insertion and removal move up
// to MaxEntries pointers and happen only on a miss, which costs an mlock.
//
// Not safe for concurrent use: the Cache's mu guards it.
type index struct {
	starts []uintptr // starts[i] == ents[i].lo
	ents   []*entry
}

func (x *index) len() int { return len(x.ents) }

// floor returns the position of the last entry starting at or below addr,
// or -1.
func (x *index) floor(addr uintptr) int {
	i, j := 0, len(x.starts)
	for i < j {
		m := int(uint(i+j) >> 1)
		if x.starts[m] <= addr {
			i = m + 1
		} else {
			j = m
		}
	}
	return i - 1
}

// overlapping returns the positions [i, j) of the entries overlapping
// [lo, hi).
func (x *index) overlapping(lo, hi uintptr) (int, int) {
	i := x.floor(lo)
	if i < 0 || x.ents[i].hi <= lo {
		i++
	}
	j := i
	for j < len(x.ents) && x.ents[j].lo < hi {
		j++
	}
	return i, j
}

func (x *index) insert(e *entry) {
	i := x.floor(e.lo) + 1
	x.starts = slices.Insert(x.starts, i, e.lo)
	x.ents = slices.Insert(x.ents, i, e)
}

// removeAt removes the entries at positions [i, j).
func (x *index) removeAt(i, j int) {
	x.starts = slices.Delete(x.starts, i, j)
	x.ents = slices.Delete(x.ents, i, j)
}

func (x *index) remove(e *entry) {
	i := x.floor(e.lo)
	if i >= 0 && x.ents[i] == e {
		x.removeAt(i, i+1)
	}
}
