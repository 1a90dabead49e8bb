package nic

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/shm"
)

// Queue-pair segments are reused between connections of the same two
// processes (docs/nic.md, "Reused queue-pair segments"). A segment made
// for each dial cost the dialer a memfd_create, an ftruncate, an mmap and
// an munmap, and the acceptor an mmap and an munmap, each munmap a TLB
// shoot-down across the CPUs that run the process: about 40 µs of CPU a
// connection on the dialer's side alone, more than a Unix socket's whole
// dial. Now the dialer keeps a closed queue pair's segment, with its fd,
// for importLinger, and hands it to its next dial to the same listener
// process once the acceptor has marked it free; the acceptor keeps its
// mapping parked (imports.go), finds it again by the file the fd names,
// and so maps nothing either.
//
// The free word (layout.go) is the hand-over. The acceptor stores 1 there
// once its queue pair is closed and its reference dropped: after its last
// access to the rings, and before the accept of a next queue pair on the
// segment could look for the mapping. The dialer reuses a segment only
// with the free word set and its own queue pair closed, and resets both
// rings (shm.ResetRing) and the word before the next hello. A segment
// goes back only to the process it was shared with (same address, same
// pid): an acceptor that breaks the rule — writes after it said free —
// reaches only its own connections, as it always could.

// maxKeptQPFds bounds the dialer's queue-pair segment fds kept open for
// reuse, of live queue pairs and pooled segments together: beyond it a
// dial drops its segment's fd once the hello is sent, as before, and that
// segment is unmapped at close. So 10,000 open connections cost no more
// fds than 64. A variable for tests.
var maxKeptQPFds atomic.Int32

func init() { maxKeptQPFds.Store(64) }

// maxPooledQP bounds the closed queue pairs' segments a device keeps.
const maxPooledQP = 8

// qpPoolKey is the process a pooled segment was shared with.
type qpPoolKey struct {
	addr string // the listener's address
	pid  int    // and process, as the kernel reported it
}

// pooledQP is a dialer's closed queue pair's segment, kept for reuse.
type pooledQP struct {
	seg      *shm.Segment
	key      qpPoolKey
	capacity int
	until    time.Time
}

// qpSegment returns the segment for a new queue pair of the dialer to
// key: a pooled one that the acceptor let go of, reset, or a new one. kept
// tells whether its fd stays open for a later reuse (the dialer then
// hands it to the pool at close: poolQP).
func (d *Device) qpSegment(key qpPoolKey, capacity int) (seg *shm.Segment, kept, reused bool, err error) {
	if seg = d.takePooledQP(key, capacity); seg != nil {
		if err := resetQPSegment(seg, capacity); err == nil {
			return seg, true, true, nil
		}
		seg.Close()
		d.qpKept.Add(-1)
	}
	if seg, err = newQPSegment(capacity); err != nil {
		return nil, false, false, err
	}
	if kept = d.qpKept.Add(1) <= maxKeptQPFds.Load(); !kept {
		d.qpKept.Add(-1)
	}
	return seg, kept, false, nil
}

// takePooledQP takes a segment of the pool that was shared with key, has
// rings of capacity, and that the acceptor marked free; nil if none.
func (d *Device) takePooledQP(key qpPoolKey, capacity int) *shm.Segment {
	imports.mu.Lock()
	defer imports.mu.Unlock()
	for i, p := range d.parked.qps {
		if p.key == key && p.capacity == capacity && shm.LoadUint32(p.seg.Bytes(), qpFreeOff) == 1 {
			d.parked.qps = append(d.parked.qps[:i], d.parked.qps[i+1:]...)
			return p.seg
		}
	}
	return nil
}

// resetQPSegment makes a segment that both sides let go of a new queue
// pair's: its header written again, both rings empty.
func resetQPSegment(seg *shm.Segment, capacity int) error {
	mem := seg.Bytes()
	if len(mem) < qpSegmentSize(capacity) {
		return fmt.Errorf("nic: queue pair segment of %d bytes for rings of %d", len(mem), capacity)
	}
	for i := range 2 {
		r, err := seg.Region(qpRingsOff+i*shm.RingSize(capacity), shm.RingSize(capacity))
		if err == nil {
			err = shm.ResetRing(r, capacity)
		}
		if err != nil {
			return err
		}
	}
	shm.StoreUint32(mem, qpMagicOff, qpMagic)
	shm.StoreUint32(mem, qpVersionOff, qpVersion)
	shm.StoreUint32(mem, qpCapacityOff, uint32(capacity))
	shm.StoreUint32(mem, qpFreeOff, 0)
	return nil
}

// poolQP keeps the segment of the dialer's queue pair qp, closed, for a
// later dial to the same process; a full pool, or a closed device, unmaps
// it.
func (d *Device) poolQP(seg *shm.Segment, key qpPoolKey, capacity int) {
	imports.mu.Lock()
	if !d.parked.closed && len(d.parked.qps) < maxPooledQP {
		until := time.Now().Add(importLinger)
		d.parked.qps = append(d.parked.qps, pooledQP{seg: seg, key: key, capacity: capacity, until: until})
		d.armSweepLocked(until)
		imports.mu.Unlock()
		return
	}
	imports.mu.Unlock()
	seg.Close()
	d.qpKept.Add(-1)
}

// sweepPooledQPLocked takes the pooled segments whose time is up (all of
// them once d is closed) out of the pool, for the caller to unmap after
// imports.mu, and lowers next to the time left of the others.
func (d *Device) sweepPooledQPLocked(due func(time.Time) bool) []*shm.Segment {
	var out []*shm.Segment
	kept := d.parked.qps[:0]
	for _, p := range d.parked.qps {
		if due(p.until) {
			out = append(out, p.seg)
			continue
		}
		kept = append(kept, p)
	}
	clear(d.parked.qps[len(kept):])
	d.parked.qps = kept
	d.qpKept.Add(-int32(len(out)))
	return out
}

// errQPSegmentInUse refuses a dialer's queue-pair segment that a live
// queue pair of ours maps already (importSegment).
var errQPSegmentInUse = fmt.Errorf("%w: the dialer's queue pair segment is in use by another of its queue pairs", ErrProtocol)

// freeQPImport drops the acceptor's reference to a queue-pair segment
// (importSegment's) once its queue pair is closed, marks the segment
// free for the dialer to reuse, and parks the mapping with d for the
// accept of that next queue pair.
func freeQPImport(seg *shm.Segment, d *Device) {
	dropImportFree(seg, d, func(mem []byte) { shm.StoreUint32(mem, qpFreeOff, 1) })
}
