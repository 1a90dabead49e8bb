package main

// Suite floor: what no same-host transport can beat on this machine.
//
//   - pingpong/cacheline: two processes bounce one 8-byte word in a shared
//     line; the parent stores an odd value, the peer answers with the next
//     even one. Half of that round trip is the fastest possible one-way
//     hand-off.
//   - pingpong/futex: the same over two futex words, always sleeping
//     (FUTEX_WAIT) and always waking (FUTEX_WAKE, shared ops): the floor of
//     any transport that sleeps while it waits.
//   - pingpong/futex/unpinned: the same with neither thread pinned to a
//     CPU, as the conn suite runs its sleeping transports: the scheduler
//     may then run both ends on one CPU and spare the cross-CPU wake-up.
//   - pingpong/futexcond/unpinned: the same, each side waking the other
//     only when it announced that it sleeps, as the shm rings do. The
//     pair above wakes on every message: a peer still awake then gets a
//     system call's pause in which its answer often lands, so that pair
//     sleeps about half as often (see floorWords).
//   - pingpong/netpoll: two processes waking each other through pipes,
//     each parked in the Go netpoller on its read end (netpoll.go): the
//     floor of a wait that parks a goroutine instead of blocking a thread,
//     as the wake hub does.
//   - copy/memcpy: single-core copy() of a hot buffer to another, in this
//     process: what any transport that copies pays per byte.
//   - stream/pipeline/{cached,nt,best}: two threads streaming through a
//     shared buffer, each copying once: what two cores can stream at all
//     where the host placed them (pipeline.go).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

func init() {
	register(&Suite{
		Name: "floor",
		Doc:  "cross-process cache-line, futex and netpoller round trips, single-core copy() bandwidth, two-core pipeline bandwidth",
		Run:  runFloor,
		Rows: func(env *Env) int { return len(env.plan.copySizes) + 3*len(env.plan.pipeSizes) + 5 },
	})
	registerPeer("floor", floorPeer)
}

// Layout of the floor segment: each word on its own 128-byte line.
//
//	  0  segment header
//	128  cache-line word u64   parent: odd values; peer: the next even one
//	256  ping futex u32        parent → peer sequence number
//	384  pong futex u32        peer → parent echo of it
//	512  ping sleeper u32      1 while the peer sleeps on ping (cond mode)
//	640  pong sleeper u32      1 while the parent sleeps on pong (cond mode)
const (
	kindBenchFloor = shm.KindUser + 0x42

	floorLineOff      = shm.SegmentHeaderSize
	floorPingOff      = floorLineOff + 128
	floorPongOff      = floorPingOff + 128
	floorPingSleepOff = floorPongOff + 128
	floorPongSleepOff = floorPingSleepOff + 128
	floorSegSize      = 4096

	lineStop  = ^uint64(0) // odd: ends the peer's cache-line loop
	futexStop = ^uint32(0) // ends the peer's futex loop

	futexPoll = 50 * time.Millisecond // longest sleep before the parent checks for a dead peer
)

var errAborted = errors.New("measurement aborted")

type floorWords struct {
	line       *uint64
	ping, pong *uint32
	// In cond mode a side announces that it sleeps (1) before it sleeps
	// and the other wakes it only then: the protocol of the shm rings and
	// of futex users such as glibc. The default mode wakes on every
	// message; when the peer is still awake, that system call is a pause
	// of a microsecond or two in which the answer often lands, so that
	// side sleeps about half as often (perf: 0.87 against 1.5 sleeps per
	// round trip, sockets.BenchmarkBlockLayers).
	pingSleep, pongSleep *uint32
}

func mapFloorWords(seg *shm.Segment) (floorWords, error) {
	var w floorWords
	var err1, err2, err3, err4, err5 error
	w.line, err1 = sys.Word64(seg.Bytes(), floorLineOff)
	w.ping, err2 = sys.Word32(seg.Bytes(), floorPingOff)
	w.pong, err3 = sys.Word32(seg.Bytes(), floorPongOff)
	w.pingSleep, err4 = sys.Word32(seg.Bytes(), floorPingSleepOff)
	w.pongSleep, err5 = sys.Word32(seg.Bytes(), floorPongSleepOff)
	return w, errors.Join(err1, err2, err3, err4, err5)
}

func runFloor(ctx context.Context, env *Env) (recs []Record, err error) {
	// copy() first: it needs no peer, and its buffers are gone before the
	// round trips run. The cache-line floor comes last, so that it runs
	// close in time to the ring suite's busy ping-pong (on a VM, where the
	// host places the two vCPUs changes the cross-core latency severalfold
	// from minute to minute).
	recs = measureCopy(ctx, env)
	if err := ctx.Err(); err != nil {
		return recs, err
	}
	recs = append(recs, measurePipeline(ctx, env, env.plan.pipeSizes)...)
	if err := ctx.Err(); err != nil {
		return recs, err
	}

	seg, err := shm.CreateSegment("bench-floor", kindBenchFloor, floorSegSize)
	if err != nil {
		return nil, err
	}
	defer seg.Close()
	w, err := mapFloorWords(seg)
	if err != nil {
		return nil, err
	}
	pp, p, err := startFloorPeer(env, seg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := errors.Join(p.close(), pp.close()); err == nil {
			err = cerr
		}
	}()

	for _, m := range []struct{ pin, cond bool }{{true, false}, {false, false}, {false, true}} {
		lat, err := futexRTT(ctx, env, p, w, m.pin, m.cond)
		if err != nil {
			return recs, fmt.Errorf("futex: %w", err)
		}
		r := Result{Case: "pingpong", Transport: futexTransport(m.pin, m.cond), Size: 4, Lat: lat}
		if !m.pin {
			r.Preempted = -1
		}
		recs = append(recs, env.Report(r)...)
	}
	lat, err := netpollRTT(ctx, env, p, &pp)
	if err != nil {
		return recs, fmt.Errorf("netpoll: %w", err)
	}
	recs = append(recs, env.Report(Result{Case: "pingpong", Transport: "netpoll", Size: 1, Lat: lat})...)

	lat, err = cachelineRTT(ctx, env, p, w)
	if err != nil {
		return recs, fmt.Errorf("cacheline: %w", err)
	}
	recs = append(recs, env.Report(Result{Case: "pingpong", Transport: "cacheline", Size: 8, Lat: lat})...)
	return recs, nil
}

// cachelineRTT measures round trips of the shared word.
func cachelineRTT(ctx context.Context, env *Env, p *peer, w floorWords) (*Latency, error) {
	smp := newSampler(env.plan.latMax)
	smp.start(0)
	if err := cachelineRounds(ctx, env, p, w, env.plan.latWarm, env.plan.latTime, env.plan.latMax, smp); err != nil {
		return nil, err
	}
	return summarize(smp.result()), nil
}

// Probing the hand-off before a row: short enough to go before every row
// of the conn suite, long enough for a stable median.
const (
	handoffWarm   = 500
	handoffBudget = 10 * time.Millisecond
	handoffLaps   = 20000
)

// handoff measures the cache-line hand-off between the measuring CPUs
// now: the median half round trip of the shared word (Env.probeHandoff).
func (r *floorRef) handoff(ctx context.Context, env *Env) (float64, error) {
	smp := newSampler(handoffLaps)
	smp.start(0)
	if err := cachelineRounds(ctx, env, r.p, r.w, handoffWarm, handoffBudget, handoffLaps, smp); err != nil {
		return 0, err
	}
	return summarize(smp.result()).P50, nil
}

// probeRows makes env's rows probe the hand-off with r until the returned
// function runs (Env.probeHandoff). A probe that fails leaves its row
// without one.
func (r *floorRef) probeRows(ctx context.Context, env *Env) (stop func()) {
	env.handoff = func() float64 {
		v, _ := r.handoff(ctx, env)
		return v
	}
	return func() { env.handoff = nil }
}

// cachelineRounds measures round trips of the shared word for about budget
// or laps round trips after warm ones, adding to smp's samples (start it
// first).
func cachelineRounds(ctx context.Context, env *Env, p *peer, w floorWords, warm int, budget time.Duration, laps int, smp *sampler) error {
	atomic.StoreUint64(w.line, 0) // before the peer looks: no hand-off in flight
	var abort atomic.Bool
	return p.run(ctx, ctlMsg{Op: "cacheline"}, func(error) { abort.Store(true) }, func() error {
		return pinned(env.cpus[0], func() error {
			v := uint64(0)
			for range warm {
				if v = lineRTT(w.line, v, &abort); v == 0 {
					return errAborted
				}
			}
			smp.resume(budget, laps)
			for {
				if v = lineRTT(w.line, v, &abort); v == 0 {
					return errAborted
				}
				if !smp.lap() {
					break
				}
			}
			atomic.StoreUint64(w.line, lineStop)
			return nil
		})
	})
}

// lineRTT hands the word to the peer (v+1, odd) and spins until it comes
// back as v+2, which it returns; 0 if abort was set meanwhile.
func lineRTT(line *uint64, v uint64, abort *atomic.Bool) uint64 {
	atomic.StoreUint64(line, v+1) // publishes: the peer's turn
	v += 2
	for spins := 1; atomic.LoadUint64(line) != v; spins++ { // observes: the peer's answer
		if spins&(1<<16-1) == 0 && abort.Load() {
			return 0
		}
	}
	return v
}

// futexTransport names the futex ping-pong's row.
func futexTransport(pin, cond bool) string {
	name := "futex"
	if cond {
		name = "futexcond"
	}
	if !pin {
		name += "/unpinned"
	}
	return name
}

// futexRTT measures sleeping round trips over the ping and pong words, the
// two threads pinned to their CPUs or not, waking on every message or
// (cond) only a side that announced it sleeps.
func futexRTT(ctx context.Context, env *Env, p *peer, w floorWords, pin, cond bool) (*Latency, error) {
	smp := newSampler(env.plan.blockMax)
	smp.start(0)
	if err := futexRounds(ctx, env, p, w, pin, cond, env.plan.blockWarm, env.plan.blockTime, env.plan.blockMax, smp); err != nil {
		return nil, err
	}
	return summarize(smp.result()), nil
}

// futexRounds measures sleeping round trips for about budget or laps round
// trips after warm ones, adding to smp's samples (start it first).
func futexRounds(ctx context.Context, env *Env, p *peer, w floorWords, pin, cond bool, warm int, budget time.Duration, laps int, smp *sampler) error {
	atomic.StoreUint32(w.ping, 0)
	atomic.StoreUint32(w.pong, 0)
	atomic.StoreUint32(w.pingSleep, 0)
	atomic.StoreUint32(w.pongSleep, 0)
	var abort atomic.Bool
	cpu := env.cpus[0]
	if !pin {
		cpu = -1
	}
	cmd := ctlMsg{Op: "futex", Unpinned: !pin}
	if cond {
		cmd.Mode = "cond"
	}
	return p.run(ctx, cmd, func(error) { abort.Store(true) }, func() error {
		return pinned(cpu, func() error {
			seq := uint32(0)
			var err error
			for range warm {
				if seq, err = futexRT(w, seq, cond, &abort); err != nil {
					return err
				}
			}
			smp.resume(budget, laps)
			for {
				if seq, err = futexRT(w, seq, cond, &abort); err != nil {
					return err
				}
				if !smp.lap() {
					break
				}
			}
			atomic.StoreUint32(w.ping, futexStop)
			_, err = sys.FutexWake(w.ping, 1)
			return err
		})
	})
}

// startFloorPeer starts the floor suite's peer on seg, with the pipes of
// the netpoll ping-pong (fds firstSegFd+1 and +2 in the peer).
func startFloorPeer(env *Env, seg *shm.Segment) (pollPipes, *peer, error) {
	pp, child, err := newPollPipes()
	if err != nil {
		return pollPipes{}, nil, err
	}
	f, err := seg.File()
	if err != nil {
		closeFiles(child)
		pp.close()
		return pollPipes{}, nil, err
	}
	p, err := startPeerFiles(env, "floor", append([]*os.File{f}, child...)...)
	if err != nil {
		pp.close()
		return pollPipes{}, nil, err
	}
	return pp, p, nil
}

// floorRef is the floor suite's peer and shared words, for a reference
// measured interleaved with another suite's case.
type floorRef struct {
	refPeer
	w  floorWords
	pp pollPipes
}

func startFloorRef(env *Env) (*floorRef, error) {
	seg, err := shm.CreateSegment("bench-floor", kindBenchFloor, floorSegSize)
	if err != nil {
		return nil, err
	}
	r := &floorRef{refPeer: refPeer{seg: seg}}
	if r.w, err = mapFloorWords(seg); err == nil {
		r.pp, r.p, err = startFloorPeer(env, seg)
	}
	if err != nil {
		seg.Close()
		return nil, err
	}
	return r, nil
}

func (r *floorRef) close() error {
	return errors.Join(r.refPeer.close(), r.pp.close())
}

// refPeer is another suite's peer with its segment: a reference measured
// in rounds that alternate with this suite's case.
type refPeer struct {
	seg *shm.Segment
	p   *peer
}

func (r *refPeer) close() error {
	err := r.p.close()
	return errors.Join(err, r.seg.Close())
}

// futexRT posts seq+1 on ping, wakes the peer and sleeps until pong says
// seq+1, which it returns. In cond mode it wakes the peer only if it
// announced its sleep, and announces its own.
func futexRT(w floorWords, seq uint32, cond bool, abort *atomic.Bool) (uint32, error) {
	seq++
	atomic.StoreUint32(w.ping, seq) // publishes: the peer's turn
	if err := futexWakeSide(w.ping, w.pingSleep, cond); err != nil {
		return 0, err
	}
	for {
		got := atomic.LoadUint32(w.pong) // observes: the peer's answer
		if got == seq {
			return seq, nil
		}
		if err := futexSleepSide(w.pong, w.pongSleep, got, futexPoll, cond); err != nil {
			return 0, err
		}
		if abort.Load() {
			return 0, errAborted
		}
	}
}

// futexWakeSide wakes the sleeper on addr: always, or in cond mode only if
// it announced itself on sleeper. The caller stored its update to addr
// first (seq-cst), so a sleeper that announces after this load sees the
// update before it sleeps.
func futexWakeSide(addr, sleeper *uint32, cond bool) error {
	if cond && atomic.LoadUint32(sleeper) == 0 {
		return nil
	}
	if _, err := sys.FutexWake(addr, 1); err != nil {
		return fmt.Errorf("futex wake: %w", err)
	}
	return nil
}

// futexSleepSide sleeps on addr while it holds val, at most timeout (< 0:
// no limit); in cond mode announced on sleeper for the sleep's duration.
func futexSleepSide(addr, sleeper *uint32, val uint32, timeout time.Duration, cond bool) error {
	if !cond {
		return futexSleep(addr, val, timeout)
	}
	atomic.StoreUint32(sleeper, 1)
	var err error
	if atomic.LoadUint32(addr) == val {
		err = futexSleep(addr, val, timeout)
	}
	atomic.StoreUint32(sleeper, 0)
	return err
}

// futexSleep sleeps on addr while it holds val, at most timeout (< 0: no
// limit). Wake-ups, value changes, signals and time-outs are all fine.
func futexSleep(addr *uint32, val uint32, timeout time.Duration) error {
	err := sys.FutexWait(addr, val, int64(timeout))
	if err == nil || errors.Is(err, sys.EAGAIN) || errors.Is(err, sys.EINTR) || errors.Is(err, sys.ETIMEDOUT) {
		return nil
	}
	return fmt.Errorf("futex wait: %w", err)
}

// floorPeer is the peer of the floor suite.
func floorPeer(pc *peerConn) error {
	seg, err := pc.segment(0, kindBenchFloor, floorSegSize)
	if err != nil {
		return err
	}
	defer seg.Close()
	w, err := mapFloorWords(seg)
	if err != nil {
		return err
	}
	pp := openPollPipes(firstSegFd + 1)
	defer pp.close()
	return pc.serve(func(cmd ctlMsg) error {
		switch cmd.Op {
		case "netpoll":
			return servePollPipes(pc, &pp)
		case "cacheline":
			if err := pc.ready(); err != nil {
				return err
			}
			last := uint64(0)
			for {
				v := atomic.LoadUint64(w.line) // observes: the parent's turn
				switch {
				case v == last:
				case v == lineStop:
					return nil
				case v&1 == 1:
					last = v + 1
					atomic.StoreUint64(w.line, last) // publishes: the answer
				}
			}
		case "futex":
			if err := pc.ready(); err != nil {
				return err
			}
			cond := cmd.Mode == "cond"
			last := uint32(0)
			for {
				v := atomic.LoadUint32(w.ping) // observes: the parent's turn
				switch {
				case v == last:
					if err := futexSleepSide(w.ping, w.pingSleep, v, -1, cond); err != nil {
						return err
					}
				case v == futexStop:
					return nil
				default:
					last = v
					atomic.StoreUint32(w.pong, v) // publishes: the answer
					if err := futexWakeSide(w.pong, w.pongSleep, cond); err != nil {
						return err
					}
				}
			}
		}
		return fmt.Errorf("unknown command %q", cmd.Op)
	})
}

// measureCopy measures single-core copy() bandwidth between two hot buffers
// of the plan's sizes, in this process, and reports each size: the median
// of timed batches of about 8 MiB, and the slowest and fastest batch.
func measureCopy(ctx context.Context, env *Env) []Record {
	sizes := env.plan.copySizes
	if len(sizes) == 0 {
		return nil
	}
	maxSize := slices.Max(sizes)
	src, dst := make([]byte, maxSize), make([]byte, maxSize)
	// Fault both in with real contents: a pattern, doubled.
	for i := range min(len(src), 4096) {
		src[i] = byte(i*7 + 1)
	}
	for n := 4096; n < len(src); n *= 2 {
		copy(src[n:], src[:n])
	}
	copy(dst, src)

	var out []Record
	const batchBytes = 8 << 20 // per timed batch: long enough to time, short enough to sample
	bws := make([]float64, 0, 4096)
	for _, size := range sizes {
		if ctx.Err() != nil {
			break
		}
		k := max(1, batchBytes/size)
		bws = bws[:0]
		pinned(env.cpus[0], func() error {
			s, d := src[:size], dst[:size]
			for range k { // warm-up batch
				copy(d, s)
			}
			start := time.Now()
			for len(bws) < cap(bws) && (len(bws) < 3 || time.Since(start) < env.plan.bwTime) {
				t0 := time.Now()
				for range k {
					copy(d, s)
				}
				gbps, _ := throughput(size, int64(k), time.Since(t0))
				bws = append(bws, gbps)
			}
			return nil
		})
		bw := spreadOf(bws)
		out = append(out, env.Report(Result{Case: "copy", Transport: "memcpy", Size: size, HasBW: true,
			BW: bw.P50, BWMin: bw.Min, BWMax: bw.Max, Rate: bw.P50 * 1e3 / float64(size)})...)
	}
	// Give the buffers back now, not through the background scavenger
	// while later measurements run.
	src, dst = nil, nil
	debug.FreeOSMemory()
	return out
}
