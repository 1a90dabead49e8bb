package stats

import "github.com/sandirect/sandirect/shm"

// The statistics segment. docs/layout.md repeats this diagram;
// layout_test.go checks that the constants chain.
//
// One sealed memfd per publishing process, written only by that process's
// publisher goroutine, mapped read-only by readers (tools/sdstat):
//
//	offset 0    segment header (shm; kind KindStats)
//	     128    table header, one 128-byte line:
//	               0  magic u32 "STAT"    4  version u32
//	               8  entry size u32      12 capacity u32 (entries)
//	              16  seq u64             seqlock word: odd while the owner writes
//	              24  count u32           entries in use, ≤ capacity      [seq]
//	              28  state u32           0 live, 1 closed, 2 replaced
//	              32  interval u64        refresh period, nanoseconds
//	              40  time u64            Unix nanoseconds of the refresh [seq]
//	              48  dropped u64         counters left out of it         [seq]
//	              56  zero, to 128
//	     256    entries[capacity], 96 bytes each
//
// Entry:
//
//	 0                8        9        10        16             48             96
//	+----------------+--------+--------+---------+--------------+--------------+
//	| value u64      | glen u8| nlen u8| 0 (6 B) | group [32]B  | name [48]B   |
//	+----------------+--------+--------+---------+--------------+--------------+
//
// glen and nlen are in [1, 32] and [1, 48]; the bytes of group and name are
// from [A-Za-z0-9_./:-] and the rest of each field is zero. Fields marked
// [seq], and every entry below count, are covered by the seqlock: the owner
// stores seq+1 (odd), the fields, then seq+2 (even); a reader loads seq,
// the fields, then seq again, and keeps the copy only if both loads are
// equal and even. Every word is loaded and stored with one atomic
// (sequentially consistent) access, through shm's accessors.
//
// state is outside the seqlock. "replaced" means the owner outgrew the
// table and publishes a larger one: fetch the segment again. "closed"
// means the process stopped publishing (its last sources unregistered).
// Both are stored after the table's last update.
const (
	// KindStats is the segment kind of a statistics table.
	KindStats = shm.KindUser + 0x10

	tabHeaderOff = shm.SegmentHeaderSize // the table header's place in the segment

	// Offsets inside the table region, which starts at tabHeaderOff.
	hMagicOff     = 0
	hVersionOff   = hMagicOff + 4
	hEntrySizeOff = hVersionOff + 4
	hCapacityOff  = hEntrySizeOff + 4
	hSeqOff       = hCapacityOff + 4
	hCountOff     = hSeqOff + 8
	hStateOff     = hCountOff + 4
	hIntervalOff  = hStateOff + 4
	hTimeOff      = hIntervalOff + 8
	hDroppedOff   = hTimeOff + 8
	hEnd          = hDroppedOff + 8

	tabHeaderSize = 128
	entriesOff    = tabHeaderSize // first entry, in the region

	eValueOff = 0
	eLensOff  = eValueOff + 8
	eGroupOff = eLensOff + 8
	eNameOff  = eGroupOff + MaxGroupLen
	entrySize = eNameOff + MaxNameLen

	entryWords = entrySize / 8
	groupWords = MaxGroupLen / 8
	nameWords  = MaxNameLen / 8

	tabMagic   = 0x54415453 // "STAT"
	tabVersion = 1

	stateLive     = 0
	stateClosed   = 1
	stateReplaced = 2

	// MaxGroupLen and MaxNameLen bound a counter's group and name in bytes.
	MaxGroupLen = 32
	MaxNameLen  = 48

	// MaxEntries bounds the counters one process publishes (6 MiB of
	// table); a refresh with more publishes the first MaxEntries and
	// counts the rest as dropped.
	MaxEntries = 1 << 16

	// minEntries is the capacity of a new table before page rounding.
	minEntries = 256
)

// tableSize is the segment size that holds n entries, before rounding to
// whole pages.
func tableSize(n int) int { return tabHeaderOff + entriesOff + n*entrySize }

// capacityOf is how many entries fit in a segment of size bytes.
func capacityOf(size int) int { return (size - tabHeaderOff - entriesOff) / entrySize }

// validName tells whether s may be a group (max MaxGroupLen) or a name
// (max MaxNameLen): 1 to max bytes from [A-Za-z0-9_./:-].
func validName(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return false
		}
	}
	return true
}

func nameByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '_', c == '.', c == '/', c == ':', c == '-':
		return true
	}
	return false
}
