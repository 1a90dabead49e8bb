package sockets

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/nic"
)

// Peer death at every step of the session protocol: a real child process
// is killed (SIGKILL) at a step it reached and stopped at (told through its
// notes pipe, or placed by a test hook, see hooks.go), or that the parent
// observed in its own counters. The survivor's pending and next calls
// return errors (the time from the kill is logged: the goal is within
// 100 ms), its listener serves a new client, and fds, mappings, goroutines
// and locked memory return to their baseline.

// deathCase is one step at which the peer dies.
type deathCase struct {
	name        string
	parentDials bool   // the parent dials the child (else the child dials the parent's listener)
	parentCfg   Config // the survivor's (listener or dialer)
	childCfg    Config
	hook        step // where the child stops itself, if anywhere
	split       bool // both processes split transfers on any memory (splitAnyMemory)
	// child runs in the child process; lnAddr is the parent's listener,
	// own an address the child may listen on.
	child func(cfg *Config, lnAddr, own string) error
	// parent drives the survivor to the step and starts its pending calls;
	// after returns, the child is killed.
	parent func(r *deathRun)
	// after, if set, runs the survivor's next calls after the kill (else
	// one Read and one Write must fail).
	after func(r *deathRun)
}

// deathRun is the parent's side of one case.
type deathRun struct {
	t      *testing.T
	ln     net.Listener
	lnAddr string
	own    string // the child's address
	cfg    Config
	notes  *notes
	conn   *Conn // the survivor's connection, once there is one
	calls  []*pendingCall
	killed time.Time
	off    int    // stream bytes the survivor read before the kill
	shared []byte // a buffer of AllocBuffer the survivor writes from
}

type callResult struct {
	n   int
	err error
	at  time.Time
}

type pendingCall struct {
	name string
	ch   chan callResult
}

// start runs f as a pending call of the survivor.
func (r *deathRun) start(name string, f func() (int, error)) {
	p := &pendingCall{name: name, ch: make(chan callResult, 1)}
	r.calls = append(r.calls, p)
	go func() {
		n, err := f()
		p.ch <- callResult{n, err, time.Now()}
	}()
}

// accept takes the child's connection from the listener.
func (r *deathRun) accept() *Conn {
	r.t.Helper()
	c := within(r.t, "accept", 20*time.Second, func() net.Conn {
		c, err := r.ln.Accept()
		if err != nil {
			r.t.Errorf("accept: %v", err)
			return nil
		}
		return c
	})
	if c == nil {
		r.t.FailNow()
	}
	r.conn = c.(*Conn)
	return r.conn
}

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(n int) []byte {
	b := make([]byte, n)
	// In bulk: a call per byte took the soak's 32 MiB 3 s under the race
	// detector, before its first connection moved a byte.
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(n))
	seed[8] = 99
	rand.NewChaCha8(seed).Read(b)
	return b
}

// dialParent dials the parent's listener from the child.
func dialParent(cfg *Config, addr string) (net.Conn, error) {
	d := Dialer{Config: cfg}
	c, err := d.Dial("sandirect", addr)
	if err != nil {
		return nil, err
	}
	say("connected")
	return c, nil
}

// parked is where a child waits to be killed.
func parked() error {
	parkForever()
	return nil
}

// writeFlood writes eager messages until an error; a pending call.
func writeFlood(c net.Conn) (int, error) {
	b := make([]byte, 1000)
	for n := 0; ; {
		m, err := c.Write(b)
		n += m
		if err != nil {
			return n, err
		}
	}
}

func readOnce(c net.Conn) func() (int, error) {
	return func() (int, error) { return c.Read(make([]byte, 64<<10)) }
}

const deathXfer = 1 << 20 // a rendezvous write's size

func readMode() Config  { return Config{} }
func writeMode() Config { return Config{NoRDMARead: true} }
func withZC(c Config, z ZeroCopy) Config {
	c.ZeroCopy = z
	return c
}

var deathCases = []deathCase{
	{
		name:        "before-handshake",
		parentDials: true,
		// The child accepts the Unix connection and never answers the
		// connection manager's hello.
		child: func(cfg *Config, lnAddr, own string) error {
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: own, Net: "unixpacket"})
			if err != nil {
				return err
			}
			say("listening")
			if _, err := ln.AcceptUnix(); err != nil {
				return err
			}
			say("accepted")
			return parked()
		},
		parent: (*deathRun).dialAfterAccept,
	},
	{
		name:        "handshake/dialer-survives",
		parentDials: true,
		// The child's nic listener takes the hello and never answers it:
		// its Answer, which sees our session hello, parks.
		child: func(cfg *Config, lnAddr, own string) error {
			d, err := nic.Open(nil)
			if err != nil {
				return err
			}
			ln, err := d.Listen(own)
			if err != nil {
				return err
			}
			say("listening")
			cq := d.NewCQ()
			_, err = ln.Accept(nic.QPOptions{SendCQ: cq, RecvCQ: cq, Answer: func([]byte) ([]byte, error) {
				say("accepted")
				return nil, parked()
			}})
			return err
		},
		parent: (*deathRun).dialAfterAccept,
	},
	{
		name: "handshake/acceptor-survives",
		// The child completes the handshake, session hello and all, and
		// never touches the rings: the connection our listener made of
		// it, accepted and waited on, resets at the kill.
		child: func(cfg *Config, lnAddr, own string) error {
			c, err := resolve(cfg)
			if err != nil {
				return err
			}
			d, err := acquireDevice(&c)
			if err != nil {
				return err
			}
			bell, err := prepareHello(d)
			if err != nil {
				return err
			}
			cq := d.nic.NewCQ()
			if _, err := d.nic.Dial(lnAddr, nic.QPOptions{SendCQ: cq, RecvCQ: cq, InPlace: true,
				PrivateData: helloMsg(d, &c, true, uint32(c.Window), bell)}); err != nil {
				return err
			}
			say("connected")
			return parked()
		},
		parent: func(r *deathRun) {
			r.notes.wait(r.t, "connected")
			r.start("read", readOnce(r.accept()))
		},
	},
	{
		name: "eager",
		hook: stepDataSent, // after the first of three data messages
		child: func(cfg *Config, lnAddr, own string) error {
			c, err := dialParent(cfg, lnAddr)
			if err != nil {
				return err
			}
			_, err = c.Write(randBytes(eagerDeathBytes))
			return err
		},
		parent: func(r *deathRun) {
			c := r.accept()
			r.notes.wait(r.t, "at "+string(stepDataSent))
			got := make([]byte, c.maxData)
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, randBytes(eagerDeathBytes)[:len(got)]) {
				r.t.Fatalf("first message: %v", err)
			}
			r.start("read", readOnce(c))
			r.start("write", func() (int, error) { return writeFlood(c) })
			waitFor(r.t, "a write stalled for credit", func() bool { return c.Stats().CreditStalls > 0 })
		},
	},
	{
		name: "closing/linger",
		// We wrote and closed; the child never reads: the connection
		// lingers for the child's done until the kill ends it (a
		// rendezvous: what lies in the ring alone would not linger).
		child: childDialsAndParks,
		parent: func(r *deathRun) {
			c := r.accept()
			if _, err := c.Write(randBytes(deathXfer)); err != nil {
				r.t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				r.t.Fatal(err)
			}
			if n := c.Stats().QuickCloses; n != 0 {
				r.t.Fatalf("QuickCloses %d: the Close did not linger, the case tests nothing", n)
			}
			r.conn = nil // closed: what follows is the linger's
			r.start("linger", func() (int, error) {
				<-c.tornDown
				return 0, errors.New("torn down")
			})
			r.start("flush", func() (int, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if err := Flush(ctx); err != nil {
					return 0, err
				}
				return 0, errors.New("flushed")
			})
		},
	},
	{
		name:      "read-rendezvous/sender-survives",
		parentCfg: withZC(readMode(), ZeroCopyAlways),
		// The child takes the rts but never reads: our zero-copy write
		// waits for its done.
		child: childDialsAndParks,
		parent: func(r *deathRun) {
			c := r.accept()
			r.start("write", func() (int, error) { return c.Write(randBytes(deathXfer)) })
			r.start("read", readOnce(c))
			waitFor(r.t, "the rts", func() bool { return c.Stats().Rendezvous > 0 })
		},
	},
	{
		name: "read-rendezvous/sender-survives/shared-buffer",
		// As above, from a buffer of AllocBuffer, which the child maps:
		// the buffer comes back whole (FreeBuffer) once the connection
		// is gone, and the child's mapping of it with the child.
		child: childDialsAndParks,
		parent: func(r *deathRun) {
			c := r.accept()
			buf, err := AllocBuffer(c, deathXfer)
			if err != nil {
				r.t.Fatal(err)
			}
			r.shared = buf
			copy(buf, randBytes(deathXfer))
			r.start("write", func() (int, error) { return c.Write(buf) })
			waitFor(r.t, "the rts", func() bool { return c.Stats().Rendezvous > 0 })
			if st := c.Stats(); st.ZeroShared != 1 {
				r.t.Fatalf("the write's source: %+v, want the shared buffer in place", st)
			}
		},
		after: func(r *deathRun) {
			c := r.conn
			if _, err := c.Write(r.shared[:100]); !errors.Is(err, syscall.ECONNRESET) {
				r.t.Errorf("next write: %v, want a reset", err)
			}
			c.Close()
			waitTorn(r.t, c)
			if err := FreeBuffer(r.shared); err != nil {
				r.t.Fatalf("FreeBuffer after the peer died: %v", err)
			}
		},
	},
	{
		name:     "read-rendezvous/receiver-survives/zero-copy",
		childCfg: withZC(readMode(), ZeroCopyAlways),
		child:    childWritesBig,
		parent:   parentReadsSome,
		after:    parentReadsOn,
	},
	{
		name:     "read-rendezvous/receiver-survives/copy",
		childCfg: withZC(readMode(), ZeroCopyNever),
		child:    childWritesBig,
		parent:   parentReadsSome,
		after:    parentReadsOn,
	},
	{
		name:      "read-rendezvous/before-done",
		parentCfg: withZC(readMode(), ZeroCopyAlways),
		hook:      stepBeforeReadDone, // the child read everything, sends no done
		child: func(cfg *Config, lnAddr, own string) error {
			c, err := dialParent(cfg, lnAddr)
			if err != nil {
				return err
			}
			got := make([]byte, deathXfer)
			_, err = io.ReadFull(c, got)
			return err
		},
		parent: func(r *deathRun) {
			c := r.accept()
			r.start("write", func() (int, error) { return c.Write(randBytes(deathXfer)) })
			r.start("read", readOnce(c))
			r.notes.wait(r.t, "at "+string(stepBeforeReadDone))
		},
	},
	{
		name:     "write-rendezvous/sender-survives",
		childCfg: writeMode(),
		// The child takes the inline part and one chunk through its
		// staging buffer, then reads no more: our write waits for its
		// next cts.
		child: func(cfg *Config, lnAddr, own string) error {
			c, err := dialParent(cfg, lnAddr)
			if err != nil {
				return err
			}
			if _, err := io.ReadFull(c, make([]byte, cfg.withDefaults().BufferSize-headerSize+4096)); err != nil {
				return err
			}
			say("read")
			return parked()
		},
		parent: func(r *deathRun) {
			c := r.accept()
			r.start("write", func() (int, error) { return c.Write(randBytes(deathXfer)) })
			r.start("read", readOnce(c))
			r.notes.wait(r.t, "read")
			waitFor(r.t, "an RDMA Write", func() bool { return c.Stats().RDMAWrites > 0 })
		},
	},
	{
		name:      "split/sender-survives",
		split:     true,
		parentCfg: splitDeathCfg(),
		childCfg:  splitDeathCfg(),
		hook:      stepSplitCTSSent, // the child asked for our tail; it reads no head
		child: func(cfg *Config, lnAddr, own string) error {
			c, err := dialParent(cfg, lnAddr)
			if err != nil {
				return err
			}
			buf := make([]byte, splitDeathXfer)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return err
				}
			}
		},
		parent: func(r *deathRun) {
			c := r.accept()
			src := randBytes(splitDeathXfer)
			if _, err := c.Write(src); err != nil { // copied: a buffer new to us
				r.t.Fatal(err)
			}
			r.start("write", func() (int, error) { return c.Write(src) }) // offered split
			r.notes.wait(r.t, "at "+string(stepSplitCTSSent))
			waitFor(r.t, "our tail written", func() bool { return c.Stats().BytesSplitTail > 0 })
		},
	},
	{
		name:      "split/receiver-survives",
		split:     true,
		parentCfg: splitDeathCfg(),
		childCfg:  splitDeathCfg(),
		hook:      stepBeforeTail, // our cts arrived; the child writes no tail
		child: func(cfg *Config, lnAddr, own string) error {
			c, err := dialParent(cfg, lnAddr)
			if err != nil {
				return err
			}
			src := randBytes(splitDeathXfer)
			for {
				if _, err := c.Write(src); err != nil {
					return err
				}
			}
		},
		parent: func(r *deathRun) {
			c := r.accept()
			buf := make([]byte, splitDeathXfer)
			if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, randBytes(splitDeathXfer)) {
				r.t.Fatalf("first write: %v", err)
			}
			r.off = splitDeathXfer
			// The second arrives split: we read the head, the tail never
			// comes.
			r.start("read", func() (int, error) { return io.ReadFull(c, buf) })
			r.notes.wait(r.t, "at "+string(stepBeforeTail))
			waitFor(r.t, "our head read", func() bool { return c.Stats().Splits > 0 && c.Stats().RDMAReads > 1 })
		},
	},
	{
		name:      "write-rendezvous/receiver-survives/before-rdma-write",
		parentCfg: writeMode(),
		hook:      stepBeforeWrite, // our cts arrived; the child writes nothing
		child:     childWritesBig,
		parent:    parentAwaitsSink(stepBeforeWrite),
	},
	{
		name:      "write-rendezvous/receiver-survives/before-done",
		parentCfg: writeMode(),
		hook:      stepBeforeWriteDone, // our sink is written, the done never comes
		child:     childWritesBig,
		parent:    parentAwaitsSink(stepBeforeWriteDone),
	},
}

// splitDeathXfer is the size of the split death cases' writes.
const splitDeathXfer = 512 << 10

// splitDeathCfg splits writes of splitDeathXfer (with splitAnyMemory).
func splitDeathCfg() Config { return Config{SplitMin: 16 << 10} }

// childDialsAndParks connects and then does nothing until it is killed.
func childDialsAndParks(cfg *Config, lnAddr, own string) error {
	if _, err := dialParent(cfg, lnAddr); err != nil {
		return err
	}
	return parked()
}

// childWritesBig writes 4 MiB of pattern, then waits to be killed.
func childWritesBig(cfg *Config, lnAddr, own string) error {
	c, err := dialParent(cfg, lnAddr)
	if err != nil {
		return err
	}
	if _, err := c.Write(randBytes(4 << 20)); err != nil {
		return err
	}
	say("written")
	return parked()
}

// parentReadsSome reads the child's big write through the staging buffer
// until the rendezvous is under way.
func parentReadsSome(r *deathRun) {
	c := r.accept()
	want := randBytes(4 << 20)
	got := make([]byte, c.maxPayload+32<<10)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want[:len(got)]) {
		r.t.Fatalf("first bytes: %v", err)
	}
	r.off = len(got)
}

// parentReadsOn reads on after the kill: every byte it gets is the
// child's, and the stream ends with a reset, not EOF and not a hang.
func parentReadsOn(r *deathRun) {
	c := r.conn
	want := randBytes(4 << 20)
	off := r.off
	buf := make([]byte, 16<<10)
	err := within(r.t, "reading on after the kill", 10*time.Second, func() error {
		for {
			n, err := c.Read(buf)
			if n > 0 && !bytes.Equal(buf[:n], want[off:off+n]) {
				return fmt.Errorf("bytes at %d differ", off)
			}
			off += n
			if err != nil {
				return err
			}
		}
	})
	r.t.Logf("read on: %d of %d bytes, then %v after %v", off, len(want), err, time.Since(r.killed))
	if !errors.Is(err, syscall.ECONNRESET) {
		r.t.Fatalf("read on: %v, want a reset", err)
	}
}

// parentAwaitsSink reads the inline part of the child's big write, then
// offers a sink with a pending Read; the child stops at s.
func parentAwaitsSink(s step) func(r *deathRun) {
	return func(r *deathRun) {
		c := r.accept()
		got := make([]byte, c.maxPayload)
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, randBytes(4 << 20)[:len(got)]) {
			r.t.Fatalf("inline bytes: %v", err)
		}
		r.start("read", readOnce(c)) // 64 KiB: a direct sink
		r.notes.wait(r.t, "at "+string(s))
	}
}

// dialChild dials the child's address; a pending call.
// dialAfterAccept dials the child's listener once it listens and returns
// once the child has accepted.
func (r *deathRun) dialAfterAccept() {
	r.notes.wait(r.t, "listening")
	r.start("dial", r.dialChild)
	r.notes.wait(r.t, "accepted")
}

func (r *deathRun) dialChild() (int, error) {
	cfg := r.cfg
	d := Dialer{Config: &cfg}
	c, err := d.Dial("sandirect", r.own)
	if err == nil {
		c.Close()
		return 0, errors.New("dial succeeded")
	}
	return 0, err
}

func init() {
	testutil.RegisterChild("campaign-peer", func(args []string) error {
		name, lnAddr, own := args[0], args[1], args[2]
		for _, tc := range deathCases {
			if tc.name != name {
				continue
			}
			if tc.split {
				splitAnyMemory(nil)
			}
			if tc.hook != "" {
				testHook = func(s step) {
					if s == tc.hook {
						say("at " + string(s))
						parkForever()
					}
				}
			}
			cfg := tc.childCfg
			err := tc.child(&cfg, lnAddr, own)
			if err != nil {
				say("error " + err.Error())
			}
			return err
		}
		return fmt.Errorf("no case %q", name)
	})
}

// eagerDeathBytes is the eager case's write: three data messages of the
// default configuration (two of two credits' payload and a shorter one).
const eagerDeathBytes = 40000

func TestCampaignPeerDeath(t *testing.T) {
	for _, tc := range deathCases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.split {
				splitAnyMemory(t)
			}
			base := takeBaseline(t)
			r := &deathRun{t: t, lnAddr: testAddr(), own: testAddr(), cfg: tc.parentCfg}
			lc := ListenConfig{Config: &r.cfg}
			ln, err := lc.Listen(context.Background(), "sandirect", r.lnAddr)
			if err != nil {
				t.Fatal(err)
			}
			r.ln = ln
			pinned := func() uint64 { return ln.(*Listener).dev.nic.Cache().Stats().PinnedBytes }
			pinnedBefore := pinned()
			child, n := startNoted(t, "campaign-peer", tc.name, r.lnAddr, r.own)
			r.notes = n
			tc.parent(r)
			for _, p := range r.calls {
				select {
				case res := <-p.ch:
					t.Fatalf("pending %s returned before the kill: %d, %v", p.name, res.n, res.err)
				default:
				}
			}

			r.killed = time.Now()
			child.Kill()
			<-child.Done()
			t.Logf("kill: child reaped after %v", time.Since(r.killed))

			// Pending calls fail, and soon.
			for _, p := range r.calls {
				select {
				case res := <-p.ch:
					t.Logf("pending %s: error %v after the kill (%d bytes): %v", p.name, res.at.Sub(r.killed), res.n, res.err)
					if res.err == nil || res.err == io.EOF {
						t.Errorf("pending %s: %d, %v; want an error", p.name, res.n, res.err)
					}
					if r.conn != nil && !errors.Is(res.err, syscall.ECONNRESET) {
						t.Errorf("pending %s: %v, want a reset", p.name, res.err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("pending %s: no return 10 s after the kill", p.name)
				}
			}
			// Next calls fail at once.
			if tc.after != nil {
				tc.after(r)
			} else if c := r.conn; c != nil {
				for _, op := range []struct {
					name string
					f    func() (int, error)
				}{
					{"read", readOnce(c)},
					{"write", func() (int, error) { return c.Write(randBytes(100)) }},
				} {
					start := time.Now()
					res := within(t, "next "+op.name, 10*time.Second, func() callResult {
						n, err := op.f()
						return callResult{n: n, err: err}
					})
					t.Logf("next %s: %v after the kill, in %v: %v", op.name, time.Since(r.killed), time.Since(start), res.err)
					if !errors.Is(res.err, syscall.ECONNRESET) {
						t.Errorf("next %s: %d, %v; want a reset", op.name, res.n, res.err)
					}
				}
			}
			if c := r.conn; c != nil {
				if st := c.Stats(); st.Resets == 0 {
					t.Errorf("no reset counted: %+v", st)
				}
				c.Close()
				waitTorn(t, c)
			}
			// The registration cache gives back what the connection
			// pinned (it owns its entries); temporary memory (a staging
			// buffer, the slab of a copied write), and the control-pool
			// slab and doorbell stay the device's for the next one.
			dev := ln.(*Listener).dev
			staging := uint64(ln.(*Listener).cfg.StagingSize)
			temp := func() uint64 {
				dev.mu.Lock()
				defer dev.mu.Unlock()
				return uint64(dev.allocated)
			}
			waitFor(t, "the pinned bytes back to their baseline", func() bool {
				return pinned() <= pinnedBefore+max(staging, temp())+dev.ctlHeld()
			})
			t.Logf("pinned by the listener's device: %d bytes before, %d after the teardown", pinnedBefore, pinned())

			// The listener serves a new client.
			serveNewClient(t, ln, r.lnAddr, &r.cfg)
			ln.Close()
			n.close()
			base.check(t)
		})
	}
}

// serveNewClient dials the listener at addr, exchanges a rendezvous-sized
// message each way with the connection it accepts, and closes both.
func serveNewClient(t *testing.T, ln net.Listener, addr string, cfg *Config) {
	t.Helper()
	d := Dialer{Config: cfg}
	c, err := d.Dial("sandirect", addr)
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	s := within(t, "accept of the new client", 20*time.Second, func() net.Conn {
		s, err := ln.Accept()
		if err != nil {
			t.Errorf("accept of the new client: %v", err)
		}
		return s
	})
	if s == nil {
		t.FailNow()
	}
	msg := randBytes(100 << 10)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Write(msg)
		if err == nil {
			_, err = io.ReadFull(s, make([]byte, len(msg)))
		}
		errc <- err
	}()
	got := make([]byte, len(msg))
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("new client read: %v", err)
	}
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("new client write: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("new client's server side: %v", err)
	}
	c.Close()
	s.Close()
	waitTorn(t, c)
	waitTorn(t, s)
}
