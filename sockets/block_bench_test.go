package sockets

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// BenchmarkBlockLayers is an 8-byte ping-pong between two goroutines that
// sleep while they wait, in rounds that alternate between the layers: a
// raw futex pair on shared memory (the floor), the same pair waking only a
// side that announced it sleeps (futexcond), two shm rings in block
// mode, a queue pair whose completion queues wait in block mode, and a
// connection with Config.Wait block. Alternating rounds see the same
// machine; each layer reports the median of its rounds' half round trips
// and of their ratios to the futex round before them.
func BenchmarkBlockLayers(b *testing.B) {
	const per = 300 // round trips per round
	blk := shm.WaitConfig{Mode: shm.WaitBlock}
	seg, err := shm.CreateSegment("block-layers", shm.KindRings, shm.SegmentHeaderSize+2*shm.RingSize(64<<10)+4096)
	if err != nil {
		b.Fatal(err)
	}
	defer seg.Close()
	mem := seg.Bytes()[shm.SegmentHeaderSize:]
	ping, _ := sys.Word32(mem, 0)
	pong, _ := sys.Word32(mem, 128)
	pingSleeps, _ := sys.Word32(mem, 256)
	pongSleeps, _ := sys.Word32(mem, 384)
	r1, r2 := mem[4096:4096+shm.RingSize(64<<10)], mem[4096+shm.RingSize(64<<10):]
	for _, r := range [][]byte{r1, r2} {
		if err := shm.InitRing(r, 64<<10); err != nil {
			b.Fatal(err)
		}
	}
	pa, _ := shm.NewProducer(r1, blk)
	ca, _ := shm.NewConsumer(r1, blk)
	pb, _ := shm.NewProducer(r2, blk)
	cb, _ := shm.NewConsumer(r2, blk)

	ncfg := nic.DefaultConfig()
	ncfg.Wait = blk
	na, nb := nicPair(b, &ncfg)

	c, s := pipe(b, benchConfigs["block"], benchConfigs["block"])
	zc, zs := pipe(b, benchConfigs["sleep"], benchConfigs["sleep"])

	type layer struct {
		name       string
		ping, echo func() error
	}
	var fseq, eseq uint32
	msg, in, ein := make([]byte, 8), make([]byte, 8), make([]byte, 8)
	layers := []layer{
		{"futex", func() error {
			fseq++
			atomic.StoreUint32(ping, fseq)
			sys.FutexWake(ping, 1)
			for atomic.LoadUint32(pong) != fseq {
				sys.FutexWait(pong, fseq-1, -1)
			}
			return nil
		}, func() error {
			eseq++
			for atomic.LoadUint32(ping) != eseq {
				sys.FutexWait(ping, eseq-1, -1)
			}
			atomic.StoreUint32(pong, eseq)
			_, err := sys.FutexWake(pong, 1)
			return err
		}},
		// The same words, waking only a side that announced it sleeps
		// (the protocol of glibc's futex users and of the shm rings). The
		// raw pair above wakes on every message: when the peer is not
		// asleep yet, that system call is a pause of a microsecond or two
		// in which the reply often lands, so it sleeps less often.
		{"futexcond", func() error {
			fseq++
			atomic.StoreUint32(ping, fseq)
			if atomic.LoadUint32(pingSleeps) != 0 {
				sys.FutexWake(ping, 1)
			}
			for atomic.LoadUint32(pong) != fseq {
				atomic.StoreUint32(pongSleeps, 1)
				if atomic.LoadUint32(pong) != fseq {
					sys.FutexWait(pong, fseq-1, -1)
				}
				atomic.StoreUint32(pongSleeps, 0)
			}
			return nil
		}, func() error {
			eseq++
			for atomic.LoadUint32(ping) != eseq {
				atomic.StoreUint32(pingSleeps, 1)
				if atomic.LoadUint32(ping) != eseq {
					sys.FutexWait(ping, eseq-1, -1)
				}
				atomic.StoreUint32(pingSleeps, 0)
			}
			atomic.StoreUint32(pong, eseq)
			if atomic.LoadUint32(pongSleeps) != 0 {
				sys.FutexWake(pong, 1)
			}
			return nil
		}},
		{"ring", func() error {
			if err := pa.Write(1, msg, time.Time{}); err != nil {
				return err
			}
			if _, err := cb.Next(time.Time{}); err != nil {
				return err
			}
			cb.Release()
			return nil
		}, func() error {
			rec, err := ca.Next(time.Time{})
			if err != nil {
				return err
			}
			err = pb.Write(rec.Tag, rec.Data, time.Time{})
			ca.Release()
			return err
		}},
		{"nic", na.pingPong, nb.echo},
		{"sockets", func() error {
			if _, err := c.Write(msg); err != nil {
				return err
			}
			_, err := io.ReadFull(c, in)
			return err
		}, func() error {
			if _, err := io.ReadFull(s, ein); err != nil {
				return err
			}
			_, err := s.Write(ein)
			return err
		}},
		// A connection that sleeps at once (Config.ReplyWait negative).
		{"sleep", func() error {
			if _, err := zc.Write(msg); err != nil {
				return err
			}
			_, err := io.ReadFull(zc, in)
			return err
		}, func() error {
			if _, err := io.ReadFull(zs, ein); err != nil {
				return err
			}
			_, err := zs.Write(ein)
			return err
		}},
	}
	tl := make([]testutil.Layer, len(layers))
	for i, l := range layers {
		tl[i] = testutil.Layer{Name: l.name, Ping: l.ping, Echo: l.echo}
	}
	testutil.AlternatingRounds(b, tl, per, nil)
}

// nicEnd is one side of a queue pair for BenchmarkBlockLayers: 16 posted
// receives in device memory, inline sends from them.
type nicEnd struct {
	qp   *nic.QueuePair
	rcq  *nic.CompletionQueue
	buf  []byte
	mr   *nic.MemoryRegion
	comp [1]nic.Completion
}

func nicPair(b *testing.B, cfg *nic.Config) (*nicEnd, *nicEnd) {
	b.Helper()
	open := func() *nic.Device {
		d, err := nic.Open(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		return d
	}
	da, db := open(), open()
	ln, err := db.Listen(testAddr())
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	end := func(d *nic.Device) *nicEnd {
		buf, err := d.Alloc(16 * 64)
		if err != nil {
			b.Fatal(err)
		}
		mr, err := d.Register(buf, nic.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		return &nicEnd{rcq: d.NewCQ(), buf: buf, mr: mr}
	}
	ea, eb := end(da), end(db)
	accepted := make(chan error, 1)
	go func() {
		var err error
		eb.qp, err = ln.Accept(nic.QPOptions{SendCQ: db.NewCQ(), RecvCQ: eb.rcq})
		accepted <- err
	}()
	if ea.qp, err = da.Dial(ln.Addr().String(), nic.QPOptions{SendCQ: da.NewCQ(), RecvCQ: ea.rcq}); err != nil {
		b.Fatal(err)
	}
	if err := <-accepted; err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ea.qp.Close(); eb.qp.Close() })
	for _, e := range []*nicEnd{ea, eb} {
		for i := range 16 {
			if err := e.repost(uint64(i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	return ea, eb
}

func (e *nicEnd) slot(i uint64) []byte { return e.buf[i*64 : i*64+64] }

func (e *nicEnd) repost(i uint64) error {
	return e.qp.PostRecv(nic.RecvWR{ID: i, Buf: e.slot(i), LKey: e.mr.LKey})
}

// recv waits for the next message and returns its slot.
func (e *nicEnd) recv() (uint64, int, error) {
	if _, err := e.rcq.Wait(e.comp[:], time.Time{}); err != nil {
		return 0, 0, err
	}
	c := e.comp[0]
	return c.ID, c.Bytes, c.Err()
}

func (e *nicEnd) send(b []byte) error {
	return e.qp.PostSend(nic.SendWR{Op: nic.OpSend, Local: b, LKey: e.mr.LKey, Unsignaled: true})
}

func (e *nicEnd) pingPong() error {
	if err := e.send(e.buf[:8]); err != nil {
		return err
	}
	i, _, err := e.recv()
	if err != nil {
		return err
	}
	return e.repost(i)
}

func (e *nicEnd) echo() error {
	i, n, err := e.recv()
	if err != nil {
		return err
	}
	err = e.send(e.slot(i)[:n])
	if rerr := e.repost(i); err == nil {
		err = rerr
	}
	return err
}
