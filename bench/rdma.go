package main

// Suite rdma: the emulated NIC between two processes, perftest's cases.
//
//   - send_lat: send ping-pong between buffers in device memory; half
//     round trip. At 8 B it runs in rounds interleaved with the raw busy
//     ring ping-pong of the ring suite's peer (row send_lat/ring/busy), the
//     reference of its target: on this VM the cross-core round trip itself
//     changes 2-3x from one second to the next.
//   - write_lat: each side RDMA-Writes size bytes into the other's buffer
//     and polls the last word of its own for the new sequence number, as
//     perftest's ib_write_lat does; half round trip.
//   - read_lat: one RDMA Read of size bytes, posted and completed; the
//     whole operation (a read is a round trip in itself; the number is not
//     halved, as in ib_read_lat).
//   - send_bw, write_bw, read_bw: a window of operations kept in flight
//     for the plan's time; payload bytes per second.
//
// Transports: nic/shm, the peer's memory is device memory (Alloc: a shared
// segment both processes map, so RDMA is one copy); nic/cma, ordinary Go
// memory, reached with process_vm_writev/readv. cma/raw is the floor of the
// latter: process_vm_writev/readv called directly, with no NIC around it.
// memcpy, at the targets' sizes (1 and 16 MiB), is the floor of the
// former: single-core copy() of the same size, in chunks interleaved with
// nic/shm's. UCX's put and get, measured by ucx_perftest (ucx.go), are
// rows ucx/put (write_lat, write_bw) and ucx/get (read_lat, read_bw).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/pin"
	"github.com/sandirect/sandirect/shm"
)

func init() {
	register(&Suite{
		Name: "rdma",
		Doc:  "emulated NIC: send/write/read latency and bandwidth (perftest cases), device memory and cross-memory, vs UCX put/get",
		Run:  runRDMA,
		Rows: func(env *Env) int {
			lat, bw := rdmaSizes(env)
			sends := 0
			for _, s := range bw {
				if s <= rdmaRing/2-16 {
					sends++
				}
			}
			ref := 0 // send_lat's interleaved ring reference
			if slices.Contains(lat, refSize) {
				ref = 1
			}
			copies := 0 // nic/shm's interleaved copy() references
			for _, s := range bw {
				if slices.Contains(rdmaTargetSizes, s) {
					copies += 2
				}
			}
			return 3*len(lat) + 2*len(bw) + sends + 2*len(lat) + 4*len(bw) + ref + copies + // nic/shm, nic/cma and cma/raw
				ucxRows(env, "rdma")
		},
	})
	registerPeer("rdma", rdmaPeer)
	// The nic issue's targets, as ratios within one run.
	targets = append(targets,
		target{"nic send_lat 8B p50 / busy ring 8B p50 (interleaved)",
			recordKey{"rdma", "send_lat", "nic/shm", refSize, metricLatP50},
			recordKey{"rdma", "send_lat", "ring/busy", refSize, metricLatP50}, 1.5, true, nil},
		// Issue 19: an RDMA Write at least as fast as UCX's put.
		target{"nic/shm write_lat 8B p50 / ucx/put 8B p50",
			recordKey{"rdma", "write_lat", "nic/shm", 8, metricLatP50},
			recordKey{"rdma", "write_lat", "ucx/put", 8, metricLatP50}, 1.0, true, nil})
	for _, size := range rdmaTargetSizes {
		for _, cas := range []string{"write_bw", "read_bw"} {
			targets = append(targets,
				target{fmt.Sprintf("nic/shm %s %s / memcpy %s (interleaved)", cas, fsize(size), fsize(size)),
					recordKey{"rdma", cas, "nic/shm", size, metricBW},
					recordKey{"rdma", cas, "memcpy", size, metricBW}, 0.8, false, nil},
				target{fmt.Sprintf("nic/cma %s %s / raw cma %s", cas, fsize(size), fsize(size)),
					recordKey{"rdma", cas, "nic/cma", size, metricBW},
					recordKey{"rdma", cas, "cma/raw", size, metricBW}, 0.8, false, nil})
		}
	}
}

const (
	// send_lat of refSize bytes is measured in refRounds rounds
	// interleaved with the busy ring ping-pong, its target's reference.
	refSize    = 8
	refRounds  = 8
	rdmaRing   = 4 << 20 // ring capacity: sends of up to 2 MiB - 16
	rdmaWindow = 32      // operations in flight for the bandwidth cases
	rdmaRecvs  = 64      // receives the peer keeps posted
)

// Control messages over the queue pair (sends), 16 bytes.
const (
	rcStop uint32 = iota + 1
	rcSendLat
	rcWriteLat
	rcSendBW
	rcPassive // the parent works one-sided; the peer waits for the next message
	rcDone    // from the peer: the case is over
)

// rdmaConfig is the devices' configuration. The measuring side busy-polls;
// the peer spins for a while, then sleeps, so that it does not take a CPU
// from the engine while the parent works one-sided (as perftest's server
// sits idle during bandwidth tests). A process that may not lock what a
// side registers for transfers of up to size bytes (rdmaPinned) registers
// without pinning: the suite measures moving data, which pinning does not
// change, and registers everything before it measures.
func rdmaConfig(peer bool, size int) *nic.Config {
	cfg := nic.DefaultConfig()
	cfg.NoPinning = rdmaPinned(size) > pin.DefaultConfig().MaxPinnedBytes
	cfg.RingCapacity = rdmaRing
	cfg.Wait = shm.WaitConfig{Mode: shm.WaitBusyPoll}
	if peer {
		cfg.Wait = shm.WaitConfig{Mode: shm.WaitAdaptive, Spin: 200 * time.Microsecond}
	}
	cfg.SendDepth = 4 * rdmaWindow
	cfg.RecvDepth = 4 * rdmaRecvs
	return &cfg
}

// rdmaPinned is what a side registers for transfers of up to size bytes:
// its exposed buffer, the source, and the receive buffers.
func rdmaPinned(size int) int64 { return int64(2*size + rdmaRecvs*(rdmaRing/2)) }

type rdmaSide struct {
	d        *nic.Device
	scq, rcq *nic.CompletionQueue
	qp       *nic.QueuePair
	buf      []byte // exposed for remote read and write
	mr       *nic.MemoryRegion
	peerAddr uint64
	peerKey  uint64
	ctl      []byte // control messages out
	recvBufs [][]byte
	recvMR   []*nic.MemoryRegion
	cbuf     [8]nic.Completion
	scratch  []byte
	follower bool // the peer: waits for the parent without a deadline
}

// setup allocates and exposes buf (device memory for "shm"), posts
// receives, and swaps buffer descriptors with the other side.
func (s *rdmaSide) setup(mem string, size int) error {
	var err error
	if mem == "shm" {
		s.buf, err = s.d.Alloc(size)
	} else {
		s.buf = make([]byte, size)
	}
	if err != nil {
		return err
	}
	if s.mr, err = s.d.RegisterRemote(s.buf, nic.AccessLocalWrite|nic.AccessRemoteRead|nic.AccessRemoteWrite); err != nil {
		return err
	}
	// Receive buffers: one region, in device memory for "shm" (copies
	// between device memory and the rings need no fault protection).
	bs := s.d.Attr().MaxSend
	var recv []byte
	if mem == "shm" {
		recv, err = s.d.Alloc(rdmaRecvs * bs)
	} else {
		recv = make([]byte, rdmaRecvs*bs)
	}
	if err != nil {
		return err
	}
	rmr, err := s.d.Register(recv, nic.AccessLocalWrite)
	if err != nil {
		return err
	}
	for i := range rdmaRecvs {
		b := recv[i*bs : (i+1)*bs : (i+1)*bs]
		s.recvBufs = append(s.recvBufs, b)
		s.recvMR = append(s.recvMR, rmr)
		if err := s.qp.PostRecv(nic.RecvWR{ID: uint64(i), Buf: b, LKey: rmr.LKey}); err != nil {
			return err
		}
	}
	s.scratch = make([]byte, 0, s.d.Attr().MaxSend)
	s.ctl = make([]byte, 16)
	binary.LittleEndian.PutUint64(s.ctl[0:], uint64(s.mr.Addr))
	binary.LittleEndian.PutUint64(s.ctl[8:], s.mr.RKey)
	if err := s.send(s.ctl); err != nil {
		return err
	}
	m, err := s.recv()
	if err != nil {
		return err
	}
	if len(m) != 16 {
		return fmt.Errorf("descriptor of %d bytes", len(m))
	}
	s.peerAddr, s.peerKey = binary.LittleEndian.Uint64(m), binary.LittleEndian.Uint64(m[8:])
	return nil
}

func (s *rdmaSide) send(b []byte) error { return s.sendKey(b, 0) }

// sendKey sends b from the region lkey (0 for an inline send).
func (s *rdmaSide) sendKey(b []byte, lkey uint32) error {
	if err := s.qp.PostSend(nic.SendWR{Op: nic.OpSend, Local: b, LKey: lkey}); err != nil {
		return err
	}
	return s.waitSend(1)
}

// waitSend waits for n send-queue completions, failing on any error.
func (s *rdmaSide) waitSend(n int) error {
	for n > 0 {
		// A poll first: the completion of a small operation is there by
		// the time its answer is, and the deadline's clock read would
		// cost the measured loop as much as the poll.
		buf := s.cbuf[:min(n, len(s.cbuf))]
		k := s.scq.Poll(buf)
		if k == 0 {
			var err error
			if k, err = s.scq.Wait(buf, time.Now().Add(30*time.Second)); err != nil {
				return fmt.Errorf("send completion: %w", err)
			}
		}
		for _, c := range s.cbuf[:k] {
			if err := c.Err(); err != nil {
				return err
			}
		}
		n -= k
	}
	return nil
}

// recv returns a copy of the next message and reposts its buffer.
func (s *rdmaSide) recv() ([]byte, error) {
	b, id, err := s.recvNoRepost()
	if err != nil {
		return nil, err
	}
	m := append(s.scratch[:0], b...)
	s.repost(id)
	return m, nil
}

// recvNoRepost returns the next message in place; the caller reposts its
// buffer (repost) once it is done with it. The parent waits at most 30 s;
// the peer (follower) as long as it takes: the parent may work one-sided
// for longer than that (the full plan's cma/raw cases, ~30 s), and the
// peer's posted receives end its wait when the parent goes.
func (s *rdmaSide) recvNoRepost() ([]byte, uint64, error) {
	if s.follower {
		return s.recvUntil(time.Time{})
	}
	return s.recvUntil(time.Now().Add(30 * time.Second))
}

// recvUntil is recvNoRepost waiting until deadline (zero: no deadline).
// The latency loops pass none: reading the clock for a deadline on every
// message cost send_lat's p50 (docs/performance.md), and they
// cannot hang without one — their receives stay posted, so the device's
// Close (the harness's abort) or the peer's death (the queue pair's flush)
// completes one with an error.
func (s *rdmaSide) recvUntil(deadline time.Time) ([]byte, uint64, error) {
	k, err := s.rcq.Wait(s.cbuf[:1], deadline)
	if err != nil {
		return nil, 0, fmt.Errorf("receive completion: %w", err)
	}
	if k != 1 {
		return nil, 0, errors.New("no receive completion")
	}
	c := s.cbuf[0]
	if err := c.Err(); err != nil {
		return nil, 0, err
	}
	return s.recvBufs[c.ID][:c.Bytes], c.ID, nil
}

// repost posts receive buffer id again. A failure (the other side closed
// after its last message) shows in the next recv.
func (s *rdmaSide) repost(id uint64) {
	s.qp.PostRecv(nic.RecvWR{ID: id, Buf: s.recvBufs[id], LKey: s.recvMR[id].LKey})
}

func (s *rdmaSide) command(op, size uint32, count uint64) error {
	var m [16]byte
	binary.LittleEndian.PutUint32(m[0:], op)
	binary.LittleEndian.PutUint32(m[4:], size)
	binary.LittleEndian.PutUint64(m[8:], count)
	return s.send(m[:])
}

func (s *rdmaSide) close() {
	if s.qp != nil {
		s.qp.Close()
	}
	s.d.Close()
}

// rdmaTargetSizes are the bandwidth targets' sizes: every plan but the
// tests' tiny one measures them.
var rdmaTargetSizes = []int{miB, 16 * miB}

func rdmaSizes(env *Env) (lat, bw []int) {
	switch {
	case testTiny:
		return []int{8, 4 * kiB}, []int{4 * kiB, 64 * kiB}
	case env.quick:
		return []int{8, 64, 4 * kiB, 64 * kiB}, []int{64, 4 * kiB, 64 * kiB, miB, 16 * miB}
	}
	// Powers of 4 from 8 B skip 1 and 16 MiB: add the targets' sizes.
	bw = append(pow2Sizes(8, 16*miB, 4), rdmaTargetSizes...)
	slices.Sort(bw)
	return pow2Sizes(8, 64*kiB, 4), slices.Compact(bw)
}

// ringRef is the ring suite's peer and rings, for the reference that
// send_lat is measured against.
type ringRef struct {
	refPeer
	rr ringRegions
}

// startRingRef starts the ring suite's peer on a segment of rings and, as
// the ring suite does, links the two processes' wake hubs (the peer's fd
// after its segment; ringWk, which the ring ping-pong attaches to, until
// close).
func startRingRef(env *Env) (r *ringRef, err error) {
	seg, err := shm.CreateSegment("bench-ring", shm.KindRings, ringSegSize)
	if err != nil {
		return nil, err
	}
	r = &ringRef{refPeer: refPeer{seg: seg}}
	defer func() {
		if err != nil {
			seg.Close()
		}
	}()
	if r.rr, err = mapRingRegions(seg); err != nil {
		return nil, err
	}
	segf, err := seg.File()
	if err != nil {
		return nil, err
	}
	hubMine, hubTheirs, err := sys.UnixPair()
	if err != nil {
		segf.Close()
		return nil, err
	}
	defer hubMine.Close()
	if r.p, err = startPeerFiles(env, "ring", segf, hubTheirs); err != nil {
		return nil, err
	}
	if ringWk, err = linkHubs(hubMine, true); err != nil {
		r.p.close()
		return nil, fmt.Errorf("wake hubs: %w", err)
	}
	return r, nil
}

func (r *ringRef) close() error {
	if ringWk != nil {
		ringWk.close()
		ringWk = nil
	}
	return r.refPeer.close()
}

func runRDMA(ctx context.Context, env *Env) (recs []Record, err error) {
	p, err := startPeer(env, "rdma")
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := p.close(); err == nil {
			err = cerr
		}
	}()
	latSizes, bwSizes := rdmaSizes(env)
	maxSize := bwSizes[len(bwSizes)-1]
	var ref *ringRef
	if slices.Contains(latSizes, refSize) {
		if ref, err = startRingRef(env); err != nil {
			return nil, err
		}
		defer func() {
			if cerr := ref.close(); err == nil {
				err = cerr
			}
		}()
	}
	// The write_lat rows and UCX's put are told where the host had put the
	// vCPUs when they ran (Result.Handoff), as the conn suite's rows are.
	fref, err := startFloorRef(env)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := fref.close(); err == nil {
			err = cerr
		}
	}()
	defer fref.probeRows(ctx, env)()
	for _, mem := range []string{"shm", "cma"} {
		addr := fmt.Sprintf("@sandirect-bench-%d-%s", os.Getpid(), mem)
		s := &rdmaSide{}
		cfg := rdmaConfig(false, maxSize)
		if cfg.NoPinning && mem == "shm" {
			fmt.Fprintf(env.out, "(rdma: registrations not pinned, nic.Config.NoPinning: the suite registers %s a side, more than the %s this process may lock, RLIMIT_MEMLOCK)\n",
				fsize(int(rdmaPinned(maxSize))), fsize(int(pin.DefaultConfig().MaxPinnedBytes)))
		}
		if s.d, err = nic.Open(cfg); err != nil {
			return recs, err
		}
		abort := func(error) { s.d.Close() }
		cmd := ctlMsg{Op: "rdma", Mode: mem, Size: maxSize, Addr: addr}
		err = p.run(ctx, cmd, abort, func() error {
			defer s.close()
			s.scq, s.rcq = s.d.NewCQ(), s.d.NewCQ()
			var err error
			if s.qp, err = s.d.Dial(addr, nic.QPOptions{SendCQ: s.scq, RecvCQ: s.rcq}); err != nil {
				return err
			}
			if err := s.setup(mem, maxSize); err != nil {
				return err
			}
			return pinned(env.cpus[0], func() error {
				r, err := rdmaCases(ctx, env, s, ref, mem, latSizes, bwSizes)
				recs = append(recs, r...)
				if err != nil {
					return err
				}
				return s.command(rcStop, 0, 0)
			})
		})
		if err != nil {
			return recs, fmt.Errorf("nic/%s: %w", mem, err)
		}
	}
	r, err := runUCX(ctx, env)
	return append(recs, r...), err
}

func rdmaCases(ctx context.Context, env *Env, s *rdmaSide, ref *ringRef, mem string, latSizes, bwSizes []int) (recs []Record, err error) {
	transport := "nic/" + mem
	smp := newSampler(env.plan.latMax)
	// This runs in one pinned call for the whole suite: each row takes
	// the preemptions counted since the row before.
	report := func(cas string, size int, lat *Latency, hand float64) {
		flushPreemptions()
		recs = append(recs, env.Report(Result{Case: cas, Transport: transport, Size: size, Lat: lat, Handoff: hand})...)
	}
	src := make([]byte, bwSizes[len(bwSizes)-1])
	// Stable: the buffer stays mapped while it is registered, so the nic's
	// copies of it skip their fault protection (nic.AccessStable), as a
	// user's long-lived buffers can.
	smr, err := s.d.Register(src, nic.AccessLocalWrite|nic.AccessStable)
	if err != nil {
		return nil, err
	}
	if mem == "shm" { // sends do not depend on where RDMA targets live
		for _, size := range latSizes {
			if size != refSize || ref == nil {
				smp.start(0)
				if err := s.sendLat(size, env.plan.latTime, env.plan.latMax, smp); err != nil {
					return recs, err
				}
				report("send_lat", size, summarize(smp.result()), 0)
				continue
			}
			// The target's size: in rounds, each followed by a round of
			// the raw ring ping-pong between two other processes on the
			// same CPUs, so that both numbers see the same machine (on
			// this VM the cross-core round trip itself changes by 2-3x
			// from one second to the next).
			rsmp := newSampler(env.plan.latMax)
			smp.start(0)
			rsmp.start(0)
			budget, laps := env.plan.latTime/refRounds, env.plan.latMax/refRounds
			for range refRounds {
				if err := s.sendLat(size, budget, laps, smp); err != nil {
					return recs, err
				}
				if err := ringPingPong(ctx, env, ref.p, ref.rr, shm.WaitBusyPoll, size, env.plan.latWarm/refRounds, budget, laps, rsmp); err != nil {
					return recs, fmt.Errorf("reference ring ping-pong: %w", err)
				}
			}
			report("send_lat", size, summarize(smp.result()), 0)
			flushPreemptions()
			recs = append(recs, env.Report(Result{Case: "send_lat", Transport: "ring/busy", Size: size, Lat: summarize(rsmp.result())})...)
		}
	}
	for _, size := range latSizes {
		hand := env.probeHandoff() // the target's row: write_lat against UCX's put
		if err := s.command(rcWriteLat, uint32(size), 0); err != nil {
			return recs, err
		}
		wr := nic.SendWR{Op: nic.OpWrite, Local: src[:size], LKey: smr.LKey, Remote: s.peerAddr, RKey: s.peerKey}
		smp.start(env.plan.latTime)
		for seq := uint64(1); ; seq++ {
			binary.LittleEndian.PutUint64(src[size-8:], seq)
			if err := s.qp.PostSend(wr); err != nil {
				return recs, err
			}
			// The completion while the write travels, as perftest
			// polls its send CQ after each post: not between the
			// peer's answer and the next post.
			if err := s.waitSend(1); err != nil {
				return recs, err
			}
			for shm.LoadUint64(s.buf, size-8) != seq {
				if s.qp.State() != nic.QPReady {
					return recs, s.qp.Err()
				}
				shm.Pause() // as UCX's loop runs its progress between looks
			}
			if !smp.lap() {
				binary.LittleEndian.PutUint64(src[size-8:], 0) // zero: stop
				if err := s.qp.PostSend(wr); err != nil {
					return recs, err
				}
				if err := s.waitSend(1); err != nil {
					return recs, err
				}
				break
			}
		}
		if err := s.awaitDone(); err != nil {
			return recs, err
		}
		report("write_lat", size, summarize(smp.result()), hand)
	}
	if err := s.command(rcPassive, 0, 0); err != nil {
		return recs, err
	}
	for _, size := range latSizes {
		wr := nic.SendWR{Op: nic.OpRead, Local: src[:size], LKey: smr.LKey, Remote: s.peerAddr, RKey: s.peerKey}
		smp.start(env.plan.latTime)
		for {
			if err := s.qp.PostSend(wr); err != nil {
				return recs, err
			}
			if err := s.waitSend(1); err != nil {
				return recs, err
			}
			if !smp.lap() {
				break
			}
		}
		rt := smp.result()
		for i := range rt {
			rt[i] *= 2 // report the whole read, not half of it
		}
		report("read_lat", size, summarize(rt), 0)
	}
	var cdst []byte // the interleaved copy()'s destination
	for _, op := range []nic.Opcode{nic.OpWrite, nic.OpRead} {
		cas := op.String()[5:] + "_bw"
		for _, size := range bwSizes {
			measure := func(d time.Duration) (float64, error) { return s.bandwidth(d, op, src[:size], smr.LKey) }
			if mem != "shm" || !slices.Contains(rdmaTargetSizes, size) {
				bw, err := chunked(env, measure)
				if err != nil {
					return recs, err
				}
				flushPreemptions()
				recs = append(recs, env.Report(bwResult(cas, transport, size, bw))...)
				continue
			}
			// A target's size: each chunk followed by a chunk of copy()
			// of the same size on this thread, the target's reference —
			// measured apart (the floor suite), a 16 MiB copy moved by
			// ±15% between the suites' minutes, and so did the ratio.
			if cdst == nil {
				cdst = make([]byte, len(src))
				copy(cdst, src) // faulted in
			}
			bw, ref, err := interleaved(env, measure, func(d time.Duration) (float64, error) {
				return copyFor(d, cdst[:size], src[:size]), nil
			})
			if err != nil {
				return recs, err
			}
			flushPreemptions()
			recs = append(recs, env.Report(bwResult(cas, transport, size, bw))...)
			recs = append(recs, env.Report(bwResult(cas, "memcpy", size, ref))...)
		}
	}
	if mem == "cma" {
		for _, write := range []bool{true, false} {
			for _, size := range bwSizes {
				bw, err := chunked(env, func(d time.Duration) (float64, error) {
					return rawCMA(d, s.qp.PeerPID(), src[:size], s.peerAddr, write)
				})
				if err != nil {
					return recs, err
				}
				cas := "read_bw"
				if write {
					cas = "write_bw"
				}
				flushPreemptions()
				recs = append(recs, env.Report(bwResult(cas, "cma/raw", size, bw))...)
			}
		}
	}
	if err := s.command(rcDone, 0, 0); err != nil { // ends the passive phase
		return recs, err
	}
	if err := s.awaitDone(); err != nil {
		return recs, err
	}
	maxSend := s.d.Attr().MaxSend
	if mem == "shm" {
		for _, size := range bwSizes {
			if size > maxSend {
				break
			}
			bw, err := chunked(env, func(d time.Duration) (float64, error) { return s.sendBandwidth(d, src[:size], smr.LKey) })
			if err != nil {
				return recs, err
			}
			flushPreemptions()
			recs = append(recs, env.Report(bwResult("send_bw", transport, size, bw))...)
		}
	}
	return recs, ctx.Err()
}

// sendLat measures send ping-pongs of size bytes for about budget or laps
// round trips, adding to smp's samples.
func (s *rdmaSide) sendLat(size int, budget time.Duration, laps int, smp *sampler) error {
	if err := s.command(rcSendLat, uint32(size), uint64(laps)); err != nil {
		return err
	}
	// A send of at most MaxInline bytes is copied when posted: it needs no
	// completion (perftest's inline sends do the same).
	unsignaled := size <= s.d.Attr().MaxInline
	// From device memory, as the peer's echo (its receive buffer).
	wr := nic.SendWR{Op: nic.OpSend, Local: s.buf[:size], LKey: s.mr.LKey, Unsignaled: unsignaled}
	smp.resume(budget, laps)
	if err := s.qp.PostSend(wr); err != nil {
		return err
	}
	for {
		_, id, err := s.recvUntil(time.Time{})
		if err != nil {
			return err
		}
		more := smp.lap()
		if more {
			// The next ping before the receive buffer goes back: the
			// repost then overlaps the round trip (the peer's echo does
			// the same), as an application that pipelines would.
			err = s.qp.PostSend(wr)
		}
		s.repost(id)
		if err != nil {
			return err
		}
		if !unsignaled {
			if err := s.waitSend(1); err != nil {
				return err
			}
		}
		if !more {
			break
		}
	}
	// Tell the peer to stop echoing: a zero-byte send ends its loop.
	if err := s.send(nil); err != nil {
		return err
	}
	return s.awaitDone()
}

func (s *rdmaSide) awaitDone() error {
	m, err := s.recv()
	if err != nil {
		return err
	}
	if len(m) != 16 || binary.LittleEndian.Uint32(m) != rcDone {
		return fmt.Errorf("peer answered %d bytes instead of done", len(m))
	}
	return nil
}

// chunked measures a bandwidth in plan.bwChunks chunks of the plan's time,
// each a complete measurement of its own.
func chunked(env *Env, measure func(d time.Duration) (gbps float64, err error)) (bwSpread, error) {
	k := max(1, env.plan.bwChunks)
	var gbps []float64
	for range k {
		g, err := measure(env.plan.bwTime / time.Duration(k))
		if err != nil {
			return bwSpread{}, err
		}
		gbps = append(gbps, g)
	}
	return spreadOf(gbps), nil
}

// interleaved is chunked for two measurements, in alternating chunks: a
// bandwidth and its reference see the same machine.
func interleaved(env *Env, measure, reference func(d time.Duration) (gbps float64, err error)) (bw, ref bwSpread, err error) {
	k := max(1, env.plan.bwChunks)
	var a, b []float64
	for range k {
		g, err := measure(env.plan.bwTime / time.Duration(k))
		if err != nil {
			return bwSpread{}, bwSpread{}, err
		}
		r, err := reference(env.plan.bwTime / time.Duration(k))
		if err != nil {
			return bwSpread{}, bwSpread{}, err
		}
		a, b = append(a, g), append(b, r)
	}
	return spreadOf(a), spreadOf(b), nil
}

// copyFor is single-core copy() of src into dst, repeated for d.
func copyFor(d time.Duration, dst, src []byte) float64 {
	var n int64
	start := time.Now()
	for n == 0 || time.Since(start) < d {
		copy(dst, src)
		n++
	}
	gbps, _ := throughput(len(src), n, time.Since(start))
	return gbps
}

// bwResult is the row of a bandwidth measured in chunks.
func bwResult(cas, transport string, size int, bw bwSpread) Result {
	return Result{Case: cas, Transport: transport, Size: size, HasBW: true,
		BW: bw.P50, BWMin: bw.Min, BWMax: bw.Max, Rate: bw.P50 * 1e3 / float64(size)}
}

// bandwidth keeps rdmaWindow one-sided operations in flight for d.
func (s *rdmaSide) bandwidth(d time.Duration, op nic.Opcode, local []byte, lkey uint32) (float64, error) {
	wr := nic.SendWR{Op: op, Local: local, LKey: lkey, Remote: s.peerAddr, RKey: s.peerKey}
	var n int64
	inflight := 0
	start := time.Now()
	for {
		for inflight < rdmaWindow {
			if err := s.qp.PostSend(wr); err != nil {
				return 0, err
			}
			inflight++
		}
		k, err := s.scq.Wait(s.cbuf[:], time.Now().Add(30*time.Second))
		if err != nil {
			return 0, err
		}
		for _, c := range s.cbuf[:k] {
			if err := c.Err(); err != nil {
				return 0, err
			}
		}
		inflight -= k
		n += int64(k)
		if time.Since(start) > d {
			break
		}
	}
	if err := s.waitSend(inflight); err != nil {
		return 0, err
	}
	n += int64(inflight)
	gbps, _ := throughput(len(local), n, time.Since(start))
	return gbps, nil
}

// sendBandwidth streams sends; the peer acknowledges the count at the end.
func (s *rdmaSide) sendBandwidth(d time.Duration, local []byte, lkey uint32) (float64, error) {
	if err := s.command(rcSendBW, uint32(len(local)), 0); err != nil {
		return 0, err
	}
	wr := nic.SendWR{Op: nic.OpSend, Local: local, LKey: lkey}
	var n int64
	inflight := 0
	start := time.Now()
	for time.Since(start) < d {
		for inflight < rdmaWindow {
			if err := s.qp.PostSend(wr); err != nil {
				return 0, err
			}
			inflight++
			n++
		}
		k, err := s.scq.Wait(s.cbuf[:], time.Now().Add(30*time.Second))
		if err != nil {
			return 0, err
		}
		for _, c := range s.cbuf[:k] {
			if err := c.Err(); err != nil {
				return 0, err
			}
		}
		inflight -= k
	}
	if err := s.waitSend(inflight); err != nil {
		return 0, err
	}
	if err := s.send(nil); err != nil { // end of the stream
		return 0, err
	}
	m, err := s.recv()
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	if len(m) != 16 || binary.LittleEndian.Uint64(m[8:]) != uint64(n) {
		return 0, fmt.Errorf("peer received %d of %d sends", binary.LittleEndian.Uint64(m[8:]), n)
	}
	gbps, _ := throughput(len(local), n, took)
	return gbps, nil
}

// rawCMA is the floor of nic/cma: process_vm_writev/readv in a loop.
func rawCMA(d time.Duration, pid int, local []byte, raddr uint64, write bool) (float64, error) {
	var n int64
	start := time.Now()
	for n == 0 || time.Since(start) < d {
		var err error
		if write {
			_, err = sys.ProcessVMWritev(pid, local, uintptr(raddr))
		} else {
			_, err = sys.ProcessVMReadv(pid, local, uintptr(raddr))
		}
		if err != nil {
			return 0, err
		}
		n++
	}
	gbps, _ := throughput(len(local), n, time.Since(start))
	return gbps, nil
}

// rdmaPeer serves one connection per command: it listens, accepts, swaps
// descriptors and then follows the parent's control messages.
func rdmaPeer(pc *peerConn) error {
	return pc.serve(func(cmd ctlMsg) error {
		s := &rdmaSide{}
		var err error
		if s.d, err = nic.Open(rdmaConfig(true, cmd.Size)); err != nil {
			return err
		}
		defer s.close()
		ln, err := s.d.Listen(cmd.Addr)
		if err != nil {
			return err
		}
		defer ln.Close()
		if err := pc.ready(); err != nil {
			return err
		}
		s.scq, s.rcq = s.d.NewCQ(), s.d.NewCQ()
		if s.qp, err = ln.Accept(nic.QPOptions{SendCQ: s.scq, RecvCQ: s.rcq}); err != nil {
			return err
		}
		if err := s.setup(cmd.Mode, cmd.Size); err != nil {
			return err
		}
		if err := s.follow(); err != nil {
			// Also on stderr: the parent may kill us before it reads "done".
			fmt.Fprintf(os.Stderr, "rdma peer: %v\n", err)
			return err
		}
		return nil
	})
}

func (s *rdmaSide) follow() error {
	s.follower = true
	done := make([]byte, 16)
	binary.LittleEndian.PutUint32(done, rcDone)
	for {
		m, err := s.recv()
		if err != nil {
			return err
		}
		if len(m) != 16 {
			return fmt.Errorf("control message of %d bytes", len(m))
		}
		op, size := binary.LittleEndian.Uint32(m), int(binary.LittleEndian.Uint32(m[4:]))
		switch op {
		case rcStop:
			return nil
		case rcSendLat:
			for {
				m, id, err := s.recvUntil(time.Time{}) // see recvUntil
				if err != nil {
					return err
				}
				if len(m) == 0 {
					s.repost(id)
					break
				}
				if len(m) <= s.d.Attr().MaxInline {
					err = s.qp.PostSend(nic.SendWR{Op: nic.OpSend, Local: m, LKey: s.recvMR[id].LKey, Unsignaled: true})
				} else {
					err = s.sendKey(m, s.recvMR[id].LKey)
				}
				s.repost(id)
				if err != nil {
					return err
				}
			}
		case rcWriteLat:
			out := make([]byte, size)
			mr, err := s.d.Register(out, nic.AccessStable) // as src's
			if err != nil {
				return err
			}
			wr := nic.SendWR{Op: nic.OpWrite, Local: out, LKey: mr.LKey, Remote: s.peerAddr, RKey: s.peerKey}
			for last := uint64(0); ; {
				var seq uint64
				for seq = shm.LoadUint64(s.buf, size-8); seq == last; seq = shm.LoadUint64(s.buf, size-8) {
					if s.qp.State() != nic.QPReady {
						return s.qp.Err()
					}
					shm.Pause()
				}
				if seq == 0 {
					shm.StoreUint64(s.buf, size-8, 0)
					break
				}
				last = seq
				binary.LittleEndian.PutUint64(out[size-8:], seq)
				if err := s.qp.PostSend(wr); err != nil {
					return err
				}
				if err := s.waitSend(1); err != nil {
					return err
				}
			}
			s.d.Deregister(mr)
		case rcPassive:
			if _, err := s.recv(); err != nil { // the parent's rcDone
				return err
			}
		case rcSendBW:
			var n uint64
			for {
				m, id, err := s.recvNoRepost()
				if err != nil {
					return err
				}
				s.repost(id)
				if len(m) == 0 {
					break
				}
				n++
			}
			binary.LittleEndian.PutUint64(done[8:], n)
		default:
			return fmt.Errorf("unknown control op %d", op)
		}
		if err := s.send(done); err != nil {
			return err
		}
		binary.LittleEndian.PutUint64(done[8:], 0)
	}
}
