package stats

import (
	"fmt"
	"time"

	"github.com/sandirect/sandirect/shm"
)

// entry is one counter of a refresh, before it is written.
type entry struct {
	group, name string
	value       uint64
}

// table is the owner's side of a statistics segment. Only the publisher's
// refresh goroutine writes it; it is not safe for concurrent use.
type table struct {
	seg      *shm.Segment
	mem      []byte // the table region: header and entries
	capacity int
	seq      uint64 // the last even value stored in the seq word
}

// newTable creates a sealed segment with room for at least n entries
// (whatever the page rounding leaves is used too).
func newTable(n int, interval time.Duration) (*table, error) {
	n = max(n, minEntries)
	seg, err := shm.CreateSegment("stats", KindStats, tableSize(min(n, MaxEntries)))
	if err != nil {
		return nil, err
	}
	capacity := min(capacityOf(seg.Size()), MaxEntries)
	mem, err := seg.Region(tabHeaderOff, entriesOff+capacity*entrySize)
	if err != nil {
		seg.Close()
		return nil, err
	}
	// Nobody has the fd yet: plain stores would do, but every shared
	// word goes through the accessors.
	shm.StoreUint32(mem, hMagicOff, tabMagic)
	shm.StoreUint32(mem, hVersionOff, tabVersion)
	shm.StoreUint32(mem, hEntrySizeOff, entrySize)
	shm.StoreUint32(mem, hCapacityOff, uint32(capacity))
	shm.StoreUint64(mem, hIntervalOff, uint64(interval))
	return &table{seg: seg, mem: mem, capacity: capacity}, nil
}

// write publishes entries (at most capacity of them; the caller counts the
// rest in dropped) under the seqlock.
func (t *table) write(entries []entry, now time.Time, interval time.Duration, dropped uint64) {
	if len(entries) > t.capacity {
		dropped += uint64(len(entries) - t.capacity)
		entries = entries[:t.capacity]
	}
	// Publishes: "an update is under way; copies taken now are torn".
	shm.StoreUint64(t.mem, hSeqOff, t.seq+1)
	for i, e := range entries {
		t.writeEntry(entriesOff+i*entrySize, e)
	}
	shm.StoreUint32(t.mem, hCountOff, uint32(len(entries)))
	shm.StoreUint64(t.mem, hTimeOff, uint64(now.UnixNano()))
	shm.StoreUint64(t.mem, hDroppedOff, dropped)
	// Interval is outside the seqlock: a reader uses it as a hint only.
	shm.StoreUint64(t.mem, hIntervalOff, uint64(interval))
	// Publishes: the entries, count, time and dropped stored above.
	t.seq += 2
	shm.StoreUint64(t.mem, hSeqOff, t.seq)
}

func (t *table) writeEntry(off int, e entry) {
	shm.StoreUint64(t.mem, off+eValueOff, e.value)
	shm.StoreUint64(t.mem, off+eLensOff, uint64(len(e.group))|uint64(len(e.name))<<8)
	storeString(t.mem, off+eGroupOff, groupWords, e.group)
	storeString(t.mem, off+eNameOff, nameWords, e.name)
}

// storeString stores s, zero-padded, in words 8-byte words at off.
func storeString(mem []byte, off, words int, s string) {
	for w := range words {
		var v uint64
		for b := range 8 {
			if i := w*8 + b; i < len(s) {
				v |= uint64(s[i]) << (8 * b)
			}
		}
		shm.StoreUint64(mem, off+w*8, v)
	}
}

// setState stores a final state (closed or replaced) after the last write.
func (t *table) setState(s uint32) {
	// Publishes: "the table above is final; look elsewhere for news".
	shm.StoreUint32(t.mem, hStateOff, s)
}

func (t *table) close() error { return t.seg.Close() }

// errTorn reports a copy taken while the owner was writing; retry.
var errTorn = fmt.Errorf("%w: update in progress", ErrBusy)

// decode copies the table in mem (the region from the table header to the
// end of the segment, as mapped) into a Snapshot. Everything in mem was
// written by another process: each word is loaded once, atomically, and
// validated; decode never panics and never reads outside mem. It returns
// errTorn when the owner was writing meanwhile, and the table's state word
// (loaded after the copy) with any result.
func decode(mem []byte) (Snapshot, uint32, error) {
	var s Snapshot
	if len(mem) < entriesOff || len(mem)%8 != 0 {
		return s, 0, fmt.Errorf("%w: table region of %d bytes", ErrCorrupt, len(mem))
	}
	seq1 := shm.LoadUint64(mem, hSeqOff)
	magic := shm.LoadUint32(mem, hMagicOff)
	version := shm.LoadUint32(mem, hVersionOff)
	esize := shm.LoadUint32(mem, hEntrySizeOff)
	capacity := shm.LoadUint32(mem, hCapacityOff)
	count := shm.LoadUint32(mem, hCountOff)
	interval := shm.LoadUint64(mem, hIntervalOff)
	ts := shm.LoadUint64(mem, hTimeOff)
	dropped := shm.LoadUint64(mem, hDroppedOff)
	switch {
	case magic != tabMagic:
		return s, 0, fmt.Errorf("%w: bad table magic %#x", ErrCorrupt, magic)
	case version != tabVersion:
		return s, 0, fmt.Errorf("%w: table version %d, want %d", ErrCorrupt, version, tabVersion)
	case esize != entrySize:
		return s, 0, fmt.Errorf("%w: entry size %d, want %d", ErrCorrupt, esize, entrySize)
	case capacity > MaxEntries || uint64(capacity) > uint64(len(mem)-entriesOff)/entrySize:
		return s, 0, fmt.Errorf("%w: capacity %d does not fit %d bytes", ErrCorrupt, capacity, len(mem))
	}
	if seq1&1 != 0 {
		return s, 0, errTorn
	}
	if count > capacity {
		if shm.LoadUint64(mem, hSeqOff) != seq1 {
			return s, 0, errTorn
		}
		return s, 0, fmt.Errorf("%w: count %d above capacity %d", ErrCorrupt, count, capacity)
	}
	words := make([]uint64, int(count)*entryWords)
	for i := range words {
		words[i] = shm.LoadUint64(mem, entriesOff+i*8)
	}
	if shm.LoadUint64(mem, hSeqOff) != seq1 {
		return s, 0, errTorn
	}
	state := shm.LoadUint32(mem, hStateOff)
	// The copy is consistent; whatever is wrong with it now is corruption.
	if interval > uint64(time.Hour) || ts > 1<<63-1 {
		return s, state, fmt.Errorf("%w: interval %d ns, time %d", ErrCorrupt, interval, ts)
	}
	s.Time = time.Unix(0, int64(ts))
	s.Interval = time.Duration(interval)
	s.Dropped = dropped
	s.Counters = make([]Counter, count)
	for i := range s.Counters {
		c, err := decodeEntry(words[i*entryWords : (i+1)*entryWords])
		if err != nil {
			return Snapshot{}, state, fmt.Errorf("%w: entry %d: %v", ErrCorrupt, i, err)
		}
		s.Counters[i] = c
	}
	return s, state, nil
}

func decodeEntry(w []uint64) (Counter, error) {
	lens := w[eLensOff/8]
	glen, nlen := int(lens&0xff), int(lens>>8&0xff)
	if lens>>16 != 0 {
		return Counter{}, fmt.Errorf("reserved bytes %#x", lens>>16)
	}
	if glen < 1 || glen > MaxGroupLen || nlen < 1 || nlen > MaxNameLen {
		return Counter{}, fmt.Errorf("group length %d, name length %d", glen, nlen)
	}
	group, err := loadString(w[eGroupOff/8:eGroupOff/8+groupWords], glen)
	if err != nil {
		return Counter{}, fmt.Errorf("group: %v", err)
	}
	name, err := loadString(w[eNameOff/8:eNameOff/8+nameWords], nlen)
	if err != nil {
		return Counter{}, fmt.Errorf("name: %v", err)
	}
	return Counter{Group: group, Name: name, Value: w[eValueOff/8]}, nil
}

// loadString decodes n bytes from words and checks that they are name bytes
// and that the padding after them is zero.
func loadString(words []uint64, n int) (string, error) {
	b := make([]byte, 0, n)
	for i := range len(words) * 8 {
		c := byte(words[i/8] >> (8 * (i % 8)))
		switch {
		case i < n && !nameByte(c):
			return "", fmt.Errorf("byte %#x at %d", c, i)
		case i < n:
			b = append(b, c)
		case c != 0:
			return "", fmt.Errorf("non-zero padding at %d", i)
		}
	}
	return string(b), nil
}
