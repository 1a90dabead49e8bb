package nic

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/sandirect/sandirect/pin"
	"github.com/sandirect/sandirect/stats"
)

// Statistics published for tools/sdstat (package stats). Every open device
// is one source, refreshed by the stats goroutine, never on a hot path:
//
//	device/N        the device's Stats (closed queue pairs included), and
//	                queue_pairs, regions, memory_segments now open
//	device/N/pin    the registration cache's pin.Stats (unless NoPinning),
//	                and monitor_KIND = 1 naming its monitor (monitor_ebpf, …)
//	device/N/qp/M   each open queue pair's Stats, state (a QPState: 0 reset,
//	                1 ready, 2 error) and peer_pid
//
// N numbers the devices of this process from 1, in the order they were
// opened; M numbers a device's queue pairs from 1, in the order the
// statistics first saw them.

var deviceSeq atomic.Uint64

// published maps each open device to its source; a map rather than a
// Device field keeps the hooks in device.go to one line each.
var published sync.Map // *Device → *statSource

// publishStats registers d with the stats publisher (from Open).
func (d *Device) publishStats() {
	s := &statSource{
		d:     d,
		group: "device/" + strconv.FormatUint(deviceSeq.Add(1), 10),
		ids:   map[*QueuePair]qpID{},
	}
	s.pinGroup = s.group + "/pin"
	s.unregister = stats.RegisterGroups(s.snapshot)
	published.Store(d, s)
}

// unpublishStats unregisters d (from Close, before any lock is taken: it
// waits for a running snapshot, which takes d.mu). It is idempotent.
func (d *Device) unpublishStats() {
	if s, ok := published.LoadAndDelete(d); ok {
		s.(*statSource).unregister()
	}
}

// statSource is a device's statistics source. The fields after
// unregister are used only by snapshot, which the publisher never runs
// concurrently with itself.
type statSource struct {
	d               *Device
	group, pinGroup string
	unregister      func()
	ids             map[*QueuePair]qpID
	nextQP          uint64
	qps             []qpStat // the last collect's queue pairs
	total           Stats
	regions, segs   int
}

type qpID struct {
	num   uint64
	group string // "device/N/qp/M"
}

type qpStat struct {
	id qpID
	qp *QueuePair
	st Stats
}

func (s *statSource) snapshot(emit func(group, name string, v uint64)) {
	// A queue pair that closes while its counters are read adds them to
	// retired as well: take the device's sum again, so that no counter
	// ever runs backwards between refreshes.
	for range 3 {
		if s.collect() {
			break
		}
	}
	d := s.d
	emitNICStats(emit, s.group, &s.total)
	emit(s.group, "queue_pairs", uint64(len(s.qps)))
	emit(s.group, "regions", uint64(s.regions))
	emit(s.group, "memory_segments", uint64(s.segs))
	if c := d.Cache(); c != nil {
		emitPinStats(emit, s.pinGroup, c.Stats())
		// Which monitor keeps the cache honest, as a name: a table holds
		// numbers only.
		emit(s.pinGroup, "monitor_"+c.CurrentMonitor().Kind.String(), 1)
	}
	for i := range s.qps {
		q := &s.qps[i]
		emitNICStats(emit, q.id.group, &q.st)
		emit(q.id.group, "state", uint64(q.qp.State()))
		emit(q.id.group, "peer_pid", uint64(max(q.qp.PeerPID(), 0)))
	}
	clear(s.qps) // drop the pointers to queue pairs until the next refresh
}

// collect reads the device's and its queue pairs' counters into s. It
// reports whether no queue pair closed meanwhile.
func (s *statSource) collect() bool {
	d := s.d
	d.mu.Lock()
	retired := d.retired
	clear(s.qps)
	s.qps = s.qps[:0]
	for qp := range d.qps {
		s.qps = append(s.qps, qpStat{qp: qp})
	}
	s.regions = d.fresh - len(d.free)
	s.segs = len(d.memSegs)
	d.mu.Unlock()
	total := retired

	// Number queue pairs seen for the first time, forget closed ones.
	live := make(map[*QueuePair]bool, len(s.qps))
	for i := range s.qps {
		q := &s.qps[i]
		live[q.qp] = true
		id, ok := s.ids[q.qp]
		if !ok {
			s.nextQP++
			id = qpID{s.nextQP, s.group + "/qp/" + strconv.FormatUint(s.nextQP, 10)}
			s.ids[q.qp] = id
		}
		q.id = id
		q.st = q.qp.Stats()
		total.add(&q.st)
	}
	for qp := range s.ids {
		if !live[qp] {
			delete(s.ids, qp)
		}
	}
	slices.SortFunc(s.qps, func(a, b qpStat) int { return cmp.Compare(a.id.num, b.id.num) })
	s.total = total
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.retired == retired
}

func emitNICStats(emit func(group, name string, v uint64), g string, st *Stats) {
	emit(g, "sends", st.Sends)
	emit(g, "recvs", st.Recvs)
	emit(g, "writes", st.Writes)
	emit(g, "reads", st.Reads)
	emit(g, "bytes_sent", st.BytesSent)
	emit(g, "bytes_received", st.BytesReceived)
	emit(g, "bytes_written", st.BytesWritten)
	emit(g, "bytes_read", st.BytesRead)
	emit(g, "errors", st.Errors)
	emit(g, "rnr_retries", st.RNRRetries)
	emit(g, "inline_execs", st.InlineExecs)
	emit(g, "engine_execs", st.EngineExecs)
	emit(g, "polled_chunks", st.PolledChunks)
	emit(g, "engine_chunks", st.EngineChunks)
	emit(g, "segments_reused", st.SegmentsReused)
	emit(g, "held_replies", st.HeldReplies)
}

func emitPinStats(emit func(group, name string, v uint64), g string, st pin.Stats) {
	emit(g, "gets", st.Gets)
	emit(g, "hits", st.Hits)
	emit(g, "misses", st.Misses)
	emit(g, "failures", st.Failures)
	emit(g, "evictions", st.Evictions)
	emit(g, "invalidations", st.Invalidations)
	emit(g, "in_use_invalidations", st.InUseInvalidations)
	emit(g, "events_lost", st.EventsLost)
	emit(g, "full_flushes", st.FullFlushes)
	emit(g, "pinned_bytes", st.PinnedBytes)
	emit(g, "entries", st.Entries)
}
