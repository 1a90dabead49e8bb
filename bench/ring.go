package main

// Suite ring: the shm rings between two processes.
//
//   - pingpong/ring/busy, pingpong/ring/block: the parent writes a record of
//     the size on ring A, the peer copies it into a record on ring B, the
//     parent reads it; both sides wait busy-polling, or sleeping on the
//     ring's futex doorbells at once.
//   - stream/ring/busy: the parent writes records back to back on ring A;
//     the peer copies each one out into a private buffer and releases it.
//     Bandwidth counts payload bytes from the first record to the peer's
//     acknowledgement of the last.
//   - pingpong/cacheline (8 B), pingpong/futex (4 B) and pingpong/netpoll
//     (1 B): the floor suite's ping-pongs, run by the floor's peer in rounds
//     alternating with the ring's 8 B busy and block ping-pongs: the
//     references of this suite's latency targets, measured in the same
//     minutes as what they divide.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

func init() {
	register(&Suite{
		Name: "ring",
		Doc:  "shm ring ping-pong (busy-poll, block) and one-way streaming between two processes",
		Run:  runRing,
		Rows: func(env *Env) int {
			refs := 0 // the targets' interleaved references
			if slices.Contains(env.plan.pingSizes, refSize) {
				refs++ // the cache line
			}
			if slices.Contains(env.plan.blockSizes, refSize) {
				refs += 2 // the futex pair and the netpoller's
			}
			return len(env.plan.pingSizes) + len(env.plan.blockSizes) + len(env.plan.streamSizes) + refs
		},
	})
	registerPeer("ring", ringPeer)
}

// ringRefRounds is how many rounds the 8 B ping-pongs alternate with
// their targets' references.
const ringRefRounds = 8

// Layout of the ring segment: two ring regions of the largest capacity, A
// (parent → peer) right after the segment header, B (peer → parent) after
// it. Each command re-initializes the rings with the capacity it names.
const (
	ringMaxCap    = 4 << 20   // largest ring the suite uses
	pingCap       = 256 << 10 // ping-pong rings: room for a 64 KiB record
	streamCap     = 4 << 20   // streaming ring: room for 1 MiB records
	ringAOff      = shm.SegmentHeaderSize
	ringBOff      = ringAOff + (ringRegion+127)&^127
	ringRegion    = ringMaxCap + shm.RingHeaderSize
	ringSegSize   = ringBOff + ringRegion
	ackCap        = shm.MinRingCapacity << 2 // streaming: the peer's acks
	streamWarmLen = 16 << 20                 // bytes streamed before measuring
)

// Record tags between the two sides.
const (
	tagData uint16 = iota + 1
	tagSync        // stream: answer with an ack carrying the data records seen
	tagAck
	tagStop // end of the command
)

type ringRegions struct{ a, b []byte }

func mapRingRegions(seg *shm.Segment) (ringRegions, error) {
	a, err1 := seg.Region(ringAOff, ringRegion)
	b, err2 := seg.Region(ringBOff, ringRegion)
	return ringRegions{a, b}, errors.Join(err1, err2)
}

func runRing(ctx context.Context, env *Env) (recs []Record, err error) {
	seg, err := shm.CreateSegment("bench-ring", shm.KindRings, ringSegSize)
	if err != nil {
		return nil, err
	}
	defer seg.Close()
	rr, err := mapRingRegions(seg)
	if err != nil {
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
	p, err := startPeerFiles(env, "ring", segf, hubTheirs)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := p.close(); err == nil {
			err = cerr
		}
	}()
	if ringWk, err = linkHubs(hubMine, true); err != nil {
		return nil, fmt.Errorf("wake hubs: %w", err)
	}
	defer ringWk.close()

	modes := []struct {
		mode      shm.WaitMode
		sizes     []int
		warm, max int
		budget    time.Duration
	}{
		{shm.WaitBusyPoll, env.plan.pingSizes, env.plan.latWarm, env.plan.latMax, env.plan.latTime},
		{shm.WaitBlock, env.plan.blockSizes, env.plan.blockWarm, env.plan.blockMax, env.plan.blockTime},
	}
	// The targets' references, measured in rounds alternating with the
	// ring's 8 B ping-pongs (see ringRefRounds).
	var ref *floorRef
	if slices.Contains(env.plan.pingSizes, refSize) || slices.Contains(env.plan.blockSizes, refSize) {
		if ref, err = startFloorRef(env); err != nil {
			return nil, err
		}
		defer func() {
			if cerr := ref.close(); err == nil {
				err = cerr
			}
		}()
	}
	for _, m := range modes {
		smp := newSampler(m.max)
		for _, size := range m.sizes {
			if err := ctx.Err(); err != nil {
				return recs, err
			}
			smp.start(0)
			if ref == nil || size != refSize {
				if err := ringPingPong(ctx, env, p, rr, m.mode, size, m.warm, m.budget, m.max, smp); err != nil {
					return recs, fmt.Errorf("pingpong %s %d B: %w", m.mode, size, err)
				}
				recs = append(recs, env.Report(Result{Case: "pingpong", Transport: "ring/" + m.mode.String(),
					Size: size, Lat: summarize(smp.result())})...)
				continue
			}
			// In rounds, each followed by a round of the floor a target
			// divides by (the cache-line hand-off for busy polling, the
			// pinned futex wake-up for blocking) between two other
			// processes on the same CPUs: the vCPUs' placement changes
			// both severalfold from minute to minute.
			// Sleeping, the futex pair and the netpoller's (a ring parks
			// its goroutine through the wake hub, in the netpoller).
			rsmp, nsmp := newSampler(m.max), newSampler(m.max)
			rsmp.start(0)
			nsmp.start(0)
			warm, budget, laps := m.warm/ringRefRounds, m.budget/ringRefRounds, m.max/ringRefRounds
			for range ringRefRounds {
				if err := ringPingPong(ctx, env, p, rr, m.mode, size, warm, budget, laps, smp); err != nil {
					return recs, fmt.Errorf("pingpong %s %d B: %w", m.mode, size, err)
				}
				if m.mode == shm.WaitBusyPoll {
					err = cachelineRounds(ctx, env, ref.p, ref.w, warm, budget, laps, rsmp)
				} else {
					err = futexRounds(ctx, env, ref.p, ref.w, true, false, warm, budget, laps, rsmp)
					if err == nil {
						err = netpollRounds(ctx, env, ref.p, &ref.pp, warm, budget, laps, nsmp)
					}
				}
				if err != nil {
					return recs, fmt.Errorf("reference of pingpong %s %d B: %w", m.mode, size, err)
				}
			}
			recs = append(recs, env.Report(Result{Case: "pingpong", Transport: "ring/" + m.mode.String(),
				Size: size, Lat: summarize(smp.result())})...)
			refRow := Result{Case: "pingpong", Transport: "cacheline", Size: 8, Lat: summarize(rsmp.result())}
			if m.mode != shm.WaitBusyPoll {
				refRow.Transport, refRow.Size = "futex", 4
			}
			recs = append(recs, env.Report(refRow)...)
			if m.mode != shm.WaitBusyPoll {
				recs = append(recs, env.Report(Result{Case: "pingpong", Transport: "netpoll", Size: 1,
					Lat: summarize(nsmp.result())})...)
			}
		}
	}
	for _, size := range env.plan.streamSizes {
		if err := ctx.Err(); err != nil {
			return recs, err
		}
		bw, err := ringStream(ctx, env, p, rr, shm.WaitBusyPoll, size)
		if err != nil {
			return recs, fmt.Errorf("stream %d B: %w", size, err)
		}
		recs = append(recs, env.Report(Result{Case: "stream", Transport: "ring/busy", Size: size, HasBW: true,
			BW: bw.P50, BWMin: bw.Min, BWMax: bw.Max, Rate: bw.P50 * 1e3 / float64(size)})...)
	}
	return recs, nil
}

// attachParent initializes both rings and attaches this process as the
// producer of A and the consumer of B.
func attachParent(rr ringRegions, capA, capB int, mode shm.WaitMode) (*shm.Producer, *shm.Consumer, error) {
	if err := shm.InitRing(rr.a, capA); err != nil {
		return nil, nil, err
	}
	if err := shm.InitRing(rr.b, capB); err != nil {
		return nil, nil, err
	}
	cfg := shm.WaitConfig{Mode: mode}
	pa, err := shm.NewProducer(rr.a, cfg)
	if err != nil {
		return nil, nil, err
	}
	cb, err := shm.NewConsumer(rr.b, cfg)
	if err != nil {
		return nil, nil, err
	}
	ringWk.attach(pa, cb)
	return pa, cb, nil
}

// ringWk links the parent's rings to the peer's wake hub and its own.
var ringWk *hubLink

// hubLink is one process's side of the two processes' wake hubs: its own
// hub with a waiter for each ring side it holds, and the peer's hub.
type hubLink struct {
	hub    *shm.Hub
	w1, w2 *shm.Waiter
	peer   *shm.Notifier
}

// linkHubs creates this process's hub and exchanges it with the peer's
// over the socket f (the parent sends first).
func linkHubs(f *os.File, parent bool) (*hubLink, error) {
	fc, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	defer fc.Close()
	c := fc.(*net.UnixConn)
	h, err := shm.NewHub()
	if err != nil {
		return nil, err
	}
	l := &hubLink{hub: h}
	if parent {
		err = shm.SendHub(c, h)
		if err == nil {
			l.peer, err = shm.RecvNotifier(c)
		}
	} else {
		l.peer, err = shm.RecvNotifier(c)
		if err == nil {
			err = shm.SendHub(c, h)
		}
	}
	if err == nil {
		if l.w1, err = h.NewWaiter(); err == nil {
			l.w2, err = h.NewWaiter()
		}
	}
	if err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// attach makes p and c park on the link's waiters and wake the peer's.
func (l *hubLink) attach(p *shm.Producer, c *shm.Consumer) {
	p.SetWake(l.w1, l.peer)
	c.SetWake(l.w2, l.peer)
}

func (l *hubLink) close() {
	if l.peer != nil {
		l.peer.Close()
	}
	if l.w1 != nil {
		l.w1.Close()
	}
	if l.w2 != nil {
		l.w2.Close()
	}
	l.hub.Close()
}

// ringPingPong measures round trips of size-byte records for about budget
// and adds them to smp's samples (start it first).
func ringPingPong(ctx context.Context, env *Env, p *peer, rr ringRegions, mode shm.WaitMode, size, warm int, budget time.Duration, laps int, smp *sampler) error {
	pa, cb, err := attachParent(rr, pingCap, pingCap, mode)
	if err != nil {
		return err
	}
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte(i)
	}
	abort := func(err error) { pa.Fail(err); cb.Fail(err) }
	cmd := ctlMsg{Op: "pingpong", Mode: mode.String(), Size: size, Capacity: pingCap}
	return p.run(ctx, cmd, abort, func() error {
		return pinned(env.cpus[0], func() error {
			for range warm {
				if err := ringRT(pa, cb, msg); err != nil {
					return err
				}
			}
			smp.resume(budget, laps)
			for {
				if err := ringRT(pa, cb, msg); err != nil {
					return err
				}
				if !smp.lap() {
					break
				}
			}
			return pa.Write(tagStop, nil, time.Time{})
		})
	})
}

// ringRT sends msg on pa and waits for its echo on cb.
func ringRT(pa *shm.Producer, cb *shm.Consumer, msg []byte) error {
	if err := pa.Write(tagData, msg, time.Time{}); err != nil {
		return err
	}
	rec, err := cb.Next(time.Time{})
	if err != nil {
		return err
	}
	if rec.Tag != tagData || len(rec.Data) != len(msg) {
		return fmt.Errorf("echo tag %d of %d bytes, want tag %d of %d", rec.Tag, len(rec.Data), tagData, len(msg))
	}
	cb.Release()
	return nil
}

// ringStream streams size-byte records for the plan's time, in
// plan.bwChunks chunks each ended by the peer's acknowledgement, and
// returns the spread of the chunks' bandwidths.
func ringStream(ctx context.Context, env *Env, p *peer, rr ringRegions, mode shm.WaitMode, size int) (bw bwSpread, err error) {
	pa, cb, err := attachParent(rr, streamCap, ackCap, mode)
	if err != nil {
		return bw, err
	}
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i*13 + 5)
	}
	abort := func(err error) { pa.Fail(err); cb.Fail(err) }
	cmd := ctlMsg{Op: "stream", Mode: mode.String(), Size: size, Capacity: streamCap}
	// Look at the clock about every 64 KiB written.
	check := int64(max(1, 64<<10/size))
	err = p.run(ctx, cmd, abort, func() error {
		return pinned(env.cpus[0], func() error {
			warm := int64(max(16, streamWarmLen/size))
			if testTiny {
				warm = 16
			}
			for range warm {
				if err := pa.Write(tagData, src, time.Time{}); err != nil {
					return err
				}
			}
			if err := streamSync(pa, cb, warm); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			per := env.plan.bwTime / time.Duration(max(1, env.plan.bwChunks))
			var gbps []float64
			for range max(1, env.plan.bwChunks) {
				start := time.Now()
				n := int64(0)
				for n == 0 || n%check != 0 || time.Since(start) < per {
					if err := pa.Write(tagData, src, time.Time{}); err != nil {
						return err
					}
					n++
				}
				if err := streamSync(pa, cb, n); err != nil {
					return err
				}
				g, _ := throughput(size, n, time.Since(start))
				gbps = append(gbps, g)
			}
			bw = spreadOf(gbps)
			return pa.Write(tagStop, nil, time.Time{})
		})
	})
	return bw, err
}

// streamSync asks the peer how many data records it has seen since the last
// sync and checks that it is want.
func streamSync(pa *shm.Producer, cb *shm.Consumer, want int64) error {
	if err := pa.Write(tagSync, nil, time.Time{}); err != nil {
		return err
	}
	rec, err := cb.Next(time.Time{})
	if err != nil {
		return err
	}
	if rec.Tag != tagAck || len(rec.Data) != 8 {
		return fmt.Errorf("ack tag %d of %d bytes", rec.Tag, len(rec.Data))
	}
	got := int64(binary.LittleEndian.Uint64(rec.Data))
	cb.Release()
	if got != want {
		return fmt.Errorf("peer saw %d records, %d were sent", got, want)
	}
	return nil
}

// ringPeer is the peer of the ring suite: it attaches to both rings as the
// consumer of A and the producer of B after the parent initialized them.
func ringPeer(pc *peerConn) error {
	seg, err := pc.segment(0, shm.KindRings, ringSegSize)
	if err != nil {
		return err
	}
	defer seg.Close()
	rr, err := mapRingRegions(seg)
	if err != nil {
		return err
	}
	wk, err := linkHubs(os.NewFile(firstSegFd+1, "hubs"), false)
	if err != nil {
		return fmt.Errorf("wake hubs: %w", err)
	}
	defer wk.close()
	return pc.serve(func(cmd ctlMsg) error {
		mode, err := shm.ParseWaitMode(cmd.Mode)
		if err != nil {
			return err
		}
		cfg := shm.WaitConfig{Mode: mode}
		ca, err := shm.NewConsumer(rr.a, cfg)
		if err != nil {
			return err
		}
		pb, err := shm.NewProducer(rr.b, cfg)
		if err != nil {
			return err
		}
		wk.attach(pb, ca)
		if ca.Capacity() != cmd.Capacity {
			return fmt.Errorf("ring A has capacity %d, command says %d", ca.Capacity(), cmd.Capacity)
		}
		if err := pc.ready(); err != nil {
			return err
		}
		switch cmd.Op {
		case "pingpong":
			return echo(ca, pb)
		case "stream":
			return sink(ca, pb, cmd.Size)
		}
		return fmt.Errorf("unknown command %q", cmd.Op)
	})
}

// echo copies every data record from ca into a record on pb until tagStop.
func echo(ca *shm.Consumer, pb *shm.Producer) error {
	for {
		rec, err := ca.Next(time.Time{})
		if err != nil {
			return err
		}
		if rec.Tag == tagStop {
			ca.Release()
			return nil
		}
		if err := pb.Write(rec.Tag, rec.Data, time.Time{}); err != nil {
			return err
		}
		ca.Release()
	}
}

// sink copies every data record from ca into a private buffer and answers
// each tagSync with the count of data records since the previous one.
func sink(ca *shm.Consumer, pb *shm.Producer, size int) error {
	priv := make([]byte, size)
	var n uint64
	var ack [8]byte
	for {
		rec, err := ca.Next(time.Time{})
		if err != nil {
			return err
		}
		switch rec.Tag {
		case tagData:
			if len(rec.Data) != len(priv) {
				return fmt.Errorf("record of %d bytes, want %d", len(rec.Data), len(priv))
			}
			copy(priv, rec.Data)
			n++
			ca.Release()
		case tagSync:
			ca.Release()
			binary.LittleEndian.PutUint64(ack[:], n)
			n = 0
			if err := pb.Write(tagAck, ack[:], time.Time{}); err != nil {
				return err
			}
		case tagStop:
			ca.Release()
			return nil
		default:
			return fmt.Errorf("unexpected record tag %d", rec.Tag)
		}
	}
}
