package shm

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// A duplex layout for the cross-process tests: two rings in one segment,
// "up" from parent to child and "down" from child to parent.
const (
	xCapacity = 1 << 16
	xUpOff    = SegmentHeaderSize
	xDownOff  = xUpOff + RingHeaderSize + xCapacity
	xSize     = xDownOff + RingHeaderSize + xCapacity
)

func duplexSegment(t *testing.T) (*Segment, *os.File) {
	t.Helper()
	s := newSegment(t, xSize)
	for _, off := range []int{xUpOff, xDownOff} {
		r, _ := s.Region(off, RingSize(xCapacity))
		if err := InitRing(r, xCapacity); err != nil {
			t.Fatal(err)
		}
	}
	f, err := s.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return s, f
}

// exchangeHubs gives the peer at the other end of c our hub and returns
// the peer's: the parent sends first.
func exchangeHubs(c *net.UnixConn, h *Hub, parent bool) (*Notifier, error) {
	if parent {
		if err := SendHub(c, h); err != nil {
			return nil, err
		}
		return RecvNotifier(c)
	}
	n, err := RecvNotifier(c)
	if err != nil {
		return nil, err
	}
	return n, SendHub(c, h)
}

// childHub opens the child's end of the hub exchange (fd 4) and returns
// its hub and the parent's notifier.
func childHub() (*Hub, *Notifier, error) {
	fc, err := net.FileConn(os.NewFile(4, "hubsock"))
	if err != nil {
		return nil, nil, err
	}
	defer fc.Close()
	h, err := NewHub()
	if err != nil {
		return nil, nil, err
	}
	n, err := exchangeHubs(fc.(*net.UnixConn), h, false)
	if err != nil {
		h.Close()
		return nil, nil, err
	}
	return h, n, nil
}

// parentHub starts the parent's end of the hub exchange: it returns the
// file to pass to the child as fd 4 and a function that completes the
// exchange once the child runs.
func parentHub(t *testing.T) (*os.File, func() (*Hub, *Notifier)) {
	a, b, err := sys.UnixPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return b, func() (*Hub, *Notifier) {
		fc, err := net.FileConn(a)
		if err != nil {
			t.Fatal(err)
		}
		defer fc.Close()
		h := newHub(t)
		n, err := exchangeHubs(fc.(*net.UnixConn), h, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return h, n
	}
}

func openChildSegment() (*Segment, []byte, []byte, error) {
	s, err := OpenSegment(3, KindRings, xSize)
	if err != nil {
		return nil, nil, nil, err
	}
	up, err1 := s.Region(xUpOff, RingSize(xCapacity))
	down, err2 := s.Region(xDownOff, RingSize(xCapacity))
	if err := errors.Join(err1, err2); err != nil {
		s.Close()
		return nil, nil, nil, err
	}
	return s, up, down, nil
}

func init() {
	// ringecho echoes every record from "up" back on "down" until the
	// parent closes "up"; args[0] is the wait mode.
	testutil.RegisterChild("ringecho", func(args []string) error {
		mode, err := ParseWaitMode(args[0])
		if err != nil {
			return err
		}
		cfg := WaitConfig{Mode: mode, Spin: 20 * time.Microsecond}
		s, up, down, err := openChildSegment()
		if err != nil {
			return err
		}
		defer s.Close()
		h, peer, err := childHub()
		if err != nil {
			return err
		}
		defer h.Close()
		defer peer.Close() // after the producer's Close, which wakes the parent
		c, err := NewConsumer(up, cfg)
		if err != nil {
			return err
		}
		p, err := NewProducer(down, cfg)
		if err != nil {
			return err
		}
		defer p.Close()
		cw, _ := h.NewWaiter()
		pw, _ := h.NewWaiter()
		c.SetWake(cw, peer)
		p.SetWake(pw, peer)
		for {
			rec, err := c.Next(time.Now().Add(30 * time.Second))
			if errors.Is(err, ErrClosed) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := p.Write(rec.Tag, rec.Data, time.Now().Add(30*time.Second)); err != nil {
				return err
			}
			c.Release()
		}
	})
	// scribbler writes args[0] random words over both rings, then exits.
	testutil.RegisterChild("scribbler", func(args []string) error {
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return err
		}
		s, up, down, err := openChildSegment()
		if err != nil {
			return err
		}
		defer s.Close()
		rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 7))
		for i := 0; i < n; i++ {
			r := up
			if i%2 == 1 {
				r = down
			}
			// Mostly data-area headers and positions, sometimes anything.
			var off int
			switch rng.IntN(4) {
			case 0:
				off = rng.IntN(RingHeaderSize/8) * 8
			default:
				off = RingHeaderSize + rng.IntN(xCapacity/8)*8
			}
			if off == ringPClosedOff || off == ringCClosedOff&^7 {
				continue // leave the closed flags: we test corruption, not close
			}
			*word64(r, off) = rng.Uint64()
		}
		return nil
	})
}

func TestRingAcrossProcesses(t *testing.T) {
	for _, mode := range []WaitMode{WaitBusyPoll, WaitBlock, WaitAdaptive} {
		t.Run(mode.String(), func(t *testing.T) {
			s, f := duplexSegment(t)
			hf, exchange := parentHub(t)
			child := testutil.StartChild(t, "ringecho", []*os.File{f, hf}, mode.String())
			h, peer := exchange()
			cfg := WaitConfig{Mode: mode, Spin: 20 * time.Microsecond}
			up, _ := s.Region(xUpOff, RingSize(xCapacity))
			down, _ := s.Region(xDownOff, RingSize(xCapacity))
			p, err := NewProducer(up, cfg)
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewConsumer(down, cfg)
			if err != nil {
				t.Fatal(err)
			}
			p.SetWake(newWaiter(t, h), peer)
			c.SetWake(newWaiter(t, h), peer)
			rng := rand.New(rand.NewPCG(3, 4))
			msg := make([]byte, p.MaxPayload())
			n := 20000
			if mode == WaitBlock {
				n = 2000 // each round trip is two futex wake-ups
			}
			var sum, back uint32
			for i := 0; i < n; i++ {
				size := rng.IntN(64)
				if i%50 == 0 {
					size = rng.IntN(len(msg) + 1)
				}
				for j := range msg[:size] {
					msg[j] = byte(rng.Uint32())
				}
				sum = crc32.Update(sum, crc32.IEEETable, msg[:size])
				deadline := time.Now().Add(10 * time.Second)
				if err := p.Write(uint16(i), msg[:size], deadline); err != nil {
					t.Fatalf("write %d: %v\n%s", i, err, child.Output())
				}
				rec, err := c.Next(deadline)
				if err != nil {
					t.Fatalf("read %d: %v\n%s", i, err, child.Output())
				}
				if rec.Tag != uint16(i) || len(rec.Data) != size {
					t.Fatalf("echo %d: tag %d len %d, want len %d", i, rec.Tag, len(rec.Data), size)
				}
				back = crc32.Update(back, crc32.IEEETable, rec.Data)
				c.Release()
			}
			if sum != back {
				t.Fatalf("checksum %08x, echoed %08x", sum, back)
			}
			p.Close()
			if _, err := c.Next(time.Now().Add(10 * time.Second)); !errors.Is(err, ErrClosed) {
				t.Fatalf("after child closed: %v", err)
			}
			if err := child.Wait(10 * time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestScribbledRings lets a child write random words over the rings while
// this process consumes one and produces into the other: it must get
// ErrCorrupt (or ErrClosed), never a panic or a fault.
func TestScribbledRings(t *testing.T) {
	s, f := duplexSegment(t)
	up, _ := s.Region(xUpOff, RingSize(xCapacity))
	down, _ := s.Region(xDownOff, RingSize(xCapacity))
	p, err := NewProducer(up, WaitConfig{Mode: WaitBusyPoll})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(down, WaitConfig{Mode: WaitBusyPoll})
	if err != nil {
		t.Fatal(err)
	}
	child := testutil.StartChild(t, "scribbler", []*os.File{f}, "200000")
	var perr, cerr error
	exited := false
	for polls := 0; (perr == nil || cerr == nil) && polls < 1_000_000; {
		if !exited {
			select {
			case <-child.Done():
				exited = true
			default:
			}
		} else {
			polls++
		}
		if cerr == nil {
			_, _, cerr = c.Poll()
			c.Release()
		}
		if perr == nil {
			perr = p.Write(1, []byte("payload"), time.Now().Add(-time.Second))
			if errors.Is(perr, os.ErrDeadlineExceeded) {
				perr = nil
			}
		}
	}
	if err := child.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	for side, err := range map[string]error{"consumer": cerr, "producer": perr} {
		if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrClosed) {
			t.Errorf("%s: unexpected error %v", side, err)
		}
	}
	if !errors.Is(cerr, ErrCorrupt) {
		t.Errorf("consumer did not detect corruption: %v", cerr)
	}
	t.Logf("consumer: %v; producer: %v", cerr, perr)
}

// Example shows a producer and a consumer over one ring in one segment.
func Example() {
	const capacity = 4096
	seg, err := CreateSegment("example", KindRings, SegmentHeaderSize+RingSize(capacity))
	if err != nil {
		panic(err)
	}
	defer seg.Close()
	region, _ := seg.Region(SegmentHeaderSize, RingSize(capacity))
	InitRing(region, capacity)
	// In real use the consumer attaches in another process, to the same
	// segment received over a Unix socket (SendSegments, OpenSegment).
	p, _ := NewProducer(region, DefaultWaitConfig())
	c, _ := NewConsumer(region, DefaultWaitConfig())
	p.Write(1, []byte("hello"), time.Time{})
	rec, _ := c.Next(time.Time{})
	fmt.Println(rec.Tag, string(rec.Data), bytes.Equal(rec.Data, []byte("hello")))
	c.Release()
	// Output: 1 hello true
}
