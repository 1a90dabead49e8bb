package nic

import (
	"fmt"
	"sync"

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
// is mapped (we never pass a peer's segment on).

type importKey struct {
	id       shm.FileID
	kind     uint32
	readOnly bool
}

type imported struct {
	key  importKey
	seg  *shm.Segment
	refs int
}

var imports struct {
	mu    sync.Mutex
	byKey map[importKey]*imported
	bySeg map[*shm.Segment]*imported
}

// importSegment maps the segment behind fd, a peer's, or takes another
// reference to the mapping of the same file made earlier. It takes
// ownership of fd. The checks are OpenSegment's (or
// OpenSegmentReadOnly's); a file mapped before passed them already (its
// seals, size and kind cannot change) and only its size is held against
// wantMin again.
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
	if readOnly {
		seg, err = shm.OpenSegmentReadOnly(fd, kind, wantMin)
	} else {
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
	im.refs++
	return im.seg, nil
}

// releaseImport drops a reference taken by importSegment; the last one
// unmaps the segment.
func releaseImport(seg *shm.Segment) {
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
	delete(imports.byKey, im.key)
	delete(imports.bySeg, seg)
	imports.mu.Unlock()
	seg.Close()
}

// importedSegments returns how many peer segments this process maps.
func importedSegments() int {
	imports.mu.Lock()
	defer imports.mu.Unlock()
	return len(imports.byKey)
}

// Peers' wake hubs are opened once per process too, keyed by the hub
// table's file: every queue pair to a peer device passes the same hub.
// The pipe that comes with a table already open is closed unused.
var notifiers struct {
	mu    sync.Mutex
	byKey map[shm.FileID]*importedNotifier
	byN   map[*shm.Notifier]*importedNotifier
}

type importedNotifier struct {
	id   shm.FileID
	n    *shm.Notifier
	refs int
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
	notifiers.mu.Lock()
	defer notifiers.mu.Unlock()
	if im := notifiers.byKey[id]; im != nil {
		sys.Close(table)
		sys.Close(event)
		im.refs++
		return im.n, nil
	}
	n, err := shm.OpenNotifier(table, event)
	if err != nil {
		return nil, err
	}
	if notifiers.byKey == nil {
		notifiers.byKey = map[shm.FileID]*importedNotifier{}
		notifiers.byN = map[*shm.Notifier]*importedNotifier{}
	}
	im := &importedNotifier{id: id, n: n, refs: 1}
	notifiers.byKey[id] = im
	notifiers.byN[n] = im
	return n, nil
}

// releaseNotifier drops a reference taken by importNotifier; the last one
// closes the peer's hub.
func releaseNotifier(n *shm.Notifier) {
	notifiers.mu.Lock()
	im := notifiers.byN[n]
	if im == nil {
		notifiers.mu.Unlock()
		return
	}
	if im.refs--; im.refs > 0 {
		notifiers.mu.Unlock()
		return
	}
	delete(notifiers.byKey, im.id)
	delete(notifiers.byN, n)
	notifiers.mu.Unlock()
	n.Close()
}
