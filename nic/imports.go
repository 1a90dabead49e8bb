package nic

import (
	"fmt"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// Segments of peers are mapped once per process, however many queue pairs
// receive them. A peer device passes its registration table to every
// queue pair it connects and announces each of its memory segments on
// every one; mapping each copy would cost every connection an fd and a
// mapping per peer segment (1,000 connections to one peer: 2,000 fds and
// mappings for the tables alone, and Linux allows 65,530 mappings a
// process by default). The cache is keyed by the file itself (device and
// inode, which the kernel vouches for, not anything the peer says), so a
// peer can only ever get the mapping of a file it passed us. Each queue
// pair still keeps its own map from segment number to mapping, filled
// only by its own peer's announcements: what a connection can reach is
// exactly what its peer gave it.
//
// Mappings are held by references; the fd is closed as soon as the file
// is mapped (we never pass a peer's segment on). When the last queue pair
// holding one closes, the mapping is parked with its device for
// importLinger instead of unmapped: a program that dials per request
// finds its peer's segments, table and hub still mapped at the next dial.
// A segment the peer frees (SEG_DEL) is unmapped at once, a parked one
// when its time is up or its device closes.

// importLinger is how long a device keeps a peer's mapping that no queue
// pair uses any more.
var importLinger = time.Second

// parkedImports are the mappings a device keeps for its next queue pairs.
// Guarded by imports.mu.
type parkedImports struct {
	segs   map[*imported]struct{}
	notes  map[*importedNotifier]struct{}
	qps    []pooledQP  // the dialer's closed queue pairs' segments (qppool.go)
	timer  *time.Timer // sweeps expired ones; nil while nothing is parked
	due    time.Time   // when timer fires
	closed bool        // the device closed: nothing is parked any more
}

type importKey struct {
	id       shm.FileID
	kind     uint32
	readOnly bool
}

type imported struct {
	key    importKey
	seg    *shm.Segment
	refs   int
	parked *Device   // refs is 0 and the mapping kept for this device
	until  time.Time // when a parked mapping goes
}

var imports struct {
	// mu guards everything below, the notifiers, every device's parked and
	// known. A leaf: under it mappings are made and unmapped and timers
	// armed, but nothing locks.
	mu    lockrank.Mutex
	byKey map[importKey]*imported
	bySeg map[*shm.Segment]*imported
}

func init() { imports.mu.Init(lockrank.NICImports) }

// importSegment maps the segment behind fd, a peer's, or takes another
// reference to the mapping of the same file made earlier. It takes
// ownership of fd. The checks are OpenSegment's (or
// OpenSegmentReadOnly's); a file mapped before passed them already (its
// seals, size and kind cannot change) and only its size is held against
// wantMin again. A queue pair's segment (kindQP, qppool.go) is mapped
// lazily, and only one queue pair may hold it at a time.
func importSegment(fd int, kind uint32, wantMin int, readOnly bool) (*shm.Segment, error) {
	id, err := shm.FileIDOf(fd)
	if err != nil {
		sys.Close(fd)
		return nil, err
	}
	key := importKey{id: id, kind: kind, readOnly: readOnly}
	if seg, ok, err := importHit(key, wantMin); ok {
		sys.Close(fd)
		return seg, err
	}
	var seg *shm.Segment
	switch {
	case readOnly:
		seg, err = shm.OpenSegmentReadOnly(fd, kind, wantMin)
	case kind == kindQP:
		// Lazy: an idle connection touches a page or two of its rings.
		seg, err = shm.OpenSegmentLazy(fd, kind, wantMin)
	default:
		seg, err = shm.OpenSegment(fd, kind, wantMin)
	}
	if err != nil {
		return nil, err
	}
	imports.mu.Lock()
	defer imports.mu.Unlock()
	if im := imports.byKey[key]; im != nil {
		// Mapped by another queue pair while we mapped it: keep one.
		seg.Close()
		return im.ref(wantMin)
	}
	seg.DropFd()
	if imports.byKey == nil {
		imports.byKey = map[importKey]*imported{}
		imports.bySeg = map[*shm.Segment]*imported{}
	}
	im := &imported{key: key, seg: seg, refs: 1}
	imports.byKey[key] = im
	imports.bySeg[seg] = im
	return seg, nil
}

// importHit takes a reference to the mapping of key if there is one.
func importHit(key importKey, wantMin int) (*shm.Segment, bool, error) {
	imports.mu.Lock()
	defer imports.mu.Unlock()
	im := imports.byKey[key]
	if im == nil {
		return nil, false, nil
	}
	seg, err := im.ref(wantMin)
	return seg, true, err
}

// ref takes a reference to im's mapping for a caller that needs wantMin
// bytes. The caller holds imports.mu.
func (im *imported) ref(wantMin int) (*shm.Segment, error) {
	if im.seg.Size() < wantMin {
		return nil, fmt.Errorf("%w: segment of %d bytes, want at least %d", shm.ErrBadSegment, im.seg.Size(), wantMin)
	}
	if im.key.kind == kindQP && im.refs > 0 {
		// Two queue pairs on one pair of rings would take each other's
		// messages.
		return nil, errQPSegmentInUse
	}
	if im.parked != nil {
		delete(im.parked.parked.segs, im)
		im.parked = nil
	}
	im.refs++
	return im.seg, nil
}

// releaseImport drops a reference taken by importSegment; the last one
// unmaps the segment.
func releaseImport(seg *shm.Segment) { dropImport(seg, nil) }

// parkImport drops a reference taken by importSegment; after the last
// one d keeps the mapping for importLinger, unless it is closed.
func parkImport(seg *shm.Segment, d *Device) { dropImport(seg, d) }

func dropImport(seg *shm.Segment, d *Device) { dropImportFree(seg, d, nil) }

// dropImportFree is dropImport that, when it drops the last reference,
// runs free on the mapping's memory under imports.mu, before the mapping
// is parked or unmapped: nobody can take the mapping again before free
// has run (freeQPImport).
func dropImportFree(seg *shm.Segment, d *Device, free func(mem []byte)) {
	imports.mu.Lock()
	im := imports.bySeg[seg]
	if im == nil {
		imports.mu.Unlock()
		return
	}
	im.refs--
	if im.refs > 0 {
		imports.mu.Unlock()
		return
	}
	if free != nil {
		free(seg.Bytes())
	}
	if d != nil && !d.parked.closed {
		if d.parked.segs == nil {
			d.parked.segs = map[*imported]struct{}{}
		}
		im.parked, im.until = d, time.Now().Add(importLinger)
		d.parked.segs[im] = struct{}{}
		d.armSweepLocked(im.until)
		imports.mu.Unlock()
		return
	}
	unlinkImportLocked(im)
	imports.mu.Unlock()
	seg.Close()
}

// unlinkImportLocked forgets im, whose mapping the caller then unmaps.
func unlinkImportLocked(im *imported) {
	if im.parked != nil {
		delete(im.parked.parked.segs, im)
		im.parked = nil
	}
	delete(imports.byKey, im.key)
	delete(imports.bySeg, im.seg)
}

// armSweepLocked makes sure that d's parked mappings are swept by until.
// The caller holds imports.mu.
func (d *Device) armSweepLocked(until time.Time) {
	p := &d.parked
	if p.timer != nil && !p.due.After(until) {
		return
	}
	if p.timer != nil {
		p.timer.Stop()
	}
	p.due = until
	p.timer = time.AfterFunc(time.Until(until), d.sweepParked)
}

// sweepParked unmaps d's parked mappings whose time is up, or all of them
// once d is closed, and comes back for the rest.
func (d *Device) sweepParked() {
	now := time.Now()
	var segs []*shm.Segment
	var notes []*shm.Notifier
	imports.mu.Lock()
	next := time.Duration(-1)
	due := func(until time.Time) bool {
		if d.parked.closed || !until.After(now) {
			return true
		}
		if left := until.Sub(now); next < 0 || left < next {
			next = left
		}
		return false
	}
	for im := range d.parked.segs {
		if due(im.until) {
			unlinkImportLocked(im)
			segs = append(segs, im.seg)
		}
	}
	for in := range d.parked.notes {
		if due(in.until) {
			unlinkNotifierLocked(in)
			notes = append(notes, in.n)
		}
	}
	segs = append(segs, d.sweepPooledQPLocked(due)...) // qppool.go
	known := d.sweepKnownLocked(now, &next)            // known.go
	if d.parked.timer != nil {
		d.parked.timer.Stop() // a sweep armed for later than this one
	}
	d.parked.timer = nil
	if next >= 0 {
		d.parked.due = now.Add(next)
		d.parked.timer = time.AfterFunc(next, d.sweepParked)
	}
	imports.mu.Unlock()
	for _, s := range segs {
		s.Close()
	}
	for _, n := range notes {
		n.Close()
	}
	for _, kp := range known {
		kp.release()
	}
}

// closeParked unmaps every mapping d keeps and parks no more: d is
// closing.
func (d *Device) closeParked() {
	imports.mu.Lock()
	d.parked.closed = true
	if d.parked.timer != nil {
		d.parked.timer.Stop()
	}
	imports.mu.Unlock()
	d.sweepParked()
}

// importedSegments returns how many peer segments this process maps,
// queue pairs' segments aside (importedQPSegments).
func importedSegments() int { return countImports(func(k importKey) bool { return k.kind != kindQP }) }

// importedQPSegments returns how many dialers' queue-pair segments this
// process maps, parked ones included.
func importedQPSegments() int {
	return countImports(func(k importKey) bool { return k.kind == kindQP })
}

func countImports(match func(importKey) bool) int {
	imports.mu.Lock()
	defer imports.mu.Unlock()
	n := 0
	for k := range imports.byKey {
		if match(k) {
			n++
		}
	}
	return n
}

// Peers' wake hubs are opened once per process too, keyed by the hub
// table's file: every queue pair to a peer device passes the same hub.
// The pipe that comes with a table already open is closed unused.
// imports.mu guards them.
var notifiers struct {
	byKey map[shm.FileID]*importedNotifier
	byN   map[*shm.Notifier]*importedNotifier
}

type importedNotifier struct {
	id     shm.FileID
	n      *shm.Notifier
	refs   int
	parked *Device // as imported's
	until  time.Time
}

// importNotifier opens the peer's hub from its table and pipe, or takes
// another reference to the one opened before. It takes ownership of both
// fds.
func importNotifier(table, event int) (*shm.Notifier, error) {
	id, err := shm.FileIDOf(table)
	if err != nil {
		sys.Close(table)
		sys.Close(event)
		return nil, err
	}
	imports.mu.Lock()
	defer imports.mu.Unlock()
	if in := notifiers.byKey[id]; in != nil {
		sys.Close(table)
		sys.Close(event)
		if in.parked != nil {
			delete(in.parked.parked.notes, in)
			in.parked = nil
		}
		in.refs++
		return in.n, nil
	}
	n, err := shm.OpenNotifier(table, event)
	if err != nil {
		return nil, err
	}
	if notifiers.byKey == nil {
		notifiers.byKey = map[shm.FileID]*importedNotifier{}
		notifiers.byN = map[*shm.Notifier]*importedNotifier{}
	}
	in := &importedNotifier{id: id, n: n, refs: 1}
	notifiers.byKey[id] = in
	notifiers.byN[n] = in
	return n, nil
}

// releaseNotifier drops a reference taken by importNotifier; the last one
// closes the peer's hub.
func releaseNotifier(n *shm.Notifier) { dropNotifier(n, nil) }

// parkNotifier is parkImport for a peer's hub.
func parkNotifier(n *shm.Notifier, d *Device) { dropNotifier(n, d) }

func dropNotifier(n *shm.Notifier, d *Device) {
	imports.mu.Lock()
	in := notifiers.byN[n]
	if in == nil {
		imports.mu.Unlock()
		return
	}
	if in.refs--; in.refs > 0 {
		imports.mu.Unlock()
		return
	}
	if d != nil && !d.parked.closed {
		if d.parked.notes == nil {
			d.parked.notes = map[*importedNotifier]struct{}{}
		}
		in.parked, in.until = d, time.Now().Add(importLinger)
		d.parked.notes[in] = struct{}{}
		d.armSweepLocked(in.until)
		imports.mu.Unlock()
		return
	}
	unlinkNotifierLocked(in)
	imports.mu.Unlock()
	n.Close()
}

// unlinkNotifierLocked forgets in, which the caller then closes.
func unlinkNotifierLocked(in *importedNotifier) {
	if in.parked != nil {
		delete(in.parked.parked.notes, in)
		in.parked = nil
	}
	delete(notifiers.byKey, in.id)
	delete(notifiers.byN, in.n)
}
