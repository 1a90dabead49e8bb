package sockets

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/nic"
)

// rawSendErr makes sc send h and payload as they are, credits or not.
func rawSendErr(sc *Conn, h header, payload []byte) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.sendLocked(&h, payload)
}

// rawPost makes sc send msg as one message, header and all, unchecked.
func rawPost(sc *Conn, msg []byte) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	buf, err := sc.qp.ReserveSend(len(msg))
	if err != nil {
		return err
	}
	copy(buf, msg)
	if err := sc.qp.CommitSend(len(msg)); err != nil {
		return err
	}
	sc.sent.store(sc.sent.load() + 1)
	return nil
}

// awaitRx drives sc until n received messages wait for the application.
func awaitRx(sc *Conn, n int) error {
	end := time.Now().Add(10 * time.Second)
	for {
		sc.mu.Lock()
		k, gen := len(sc.rx)-sc.rxHead, sc.rounds
		sc.mu.Unlock()
		if k >= n {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("%d messages waiting after 10 s, want %d", k, n)
		}
		var dl deadline
		dl.init()
		dl.set(time.Now().Add(10 * time.Millisecond))
		sc.progress(gen, &dl, false)
		dl.set(time.Time{})
	}
}

// guarded is a buffer with guard bytes on both sides of its middle.
type guarded struct{ all, mid []byte }

const guardLen = 4096

func newGuarded(n int) guarded {
	all := make([]byte, n+2*guardLen)
	for i := range all {
		all[i] = 0xA5
	}
	return guarded{all, all[guardLen : guardLen+n : guardLen+n]}
}

// intact reports whether the guards, and the middle if mid, still hold
// their fill.
func (g guarded) intact(mid bool) error {
	for i, b := range g.all {
		inMid := i >= guardLen && i < len(g.all)-guardLen
		if b != 0xA5 && (!inMid || mid) {
			return fmt.Errorf("byte %d of %d written (guard %d bytes each side)", i, len(g.all), guardLen)
		}
	}
	return nil
}

// expectAbort checks that victim aborts with ErrProtocol mentioning
// reason, without writing outside the buffer it reads into, and that the
// offender sees a reset, not EOF.
func expectAbort(t *testing.T, victim, offender net.Conn, reason string) {
	t.Helper()
	expectVictimAbort(t, victim, reason)
	if err := expectOffenderReset(offender); err != nil {
		t.Fatal(err)
	}
}

// expectVictimAbort is expectAbort's check of the victim.
func expectVictimAbort(t *testing.T, victim net.Conn, reason string) {
	t.Helper()
	victim.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := newGuarded(1 << 20)
	var err error
	for err == nil {
		_, err = victim.Read(buf.mid)
	}
	if !errors.Is(err, ErrProtocol) || !bytes.Contains([]byte(err.Error()), []byte(reason)) {
		t.Fatalf("victim: %v, want ErrProtocol with %q", err, reason)
	}
	if err := buf.intact(false); err != nil {
		t.Fatalf("victim's read buffer: %v", err)
	}
	if _, err := victim.Write([]byte("x")); !errors.Is(err, ErrProtocol) {
		t.Fatalf("victim write after abort: %v", err)
	}
}

// expectOffenderReset is expectAbort's check of the offender.
func expectOffenderReset(offender net.Conn) error {
	if sc, ok := offender.(*Conn); ok {
		// Without a Read until it fails: a Read would answer an rts of
		// the victim's with a cts of its own, a second violation that
		// can reach the victim before the one under test has failed its
		// RDMA operation.
		driveUntilFailed(sc, 10*time.Second)
	}
	offender.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1<<20)
	var err error
	for err == nil {
		_, err = offender.Read(buf)
	}
	if !errors.Is(err, syscall.ECONNRESET) || err == io.EOF {
		return fmt.Errorf("offender: %v, want a reset", err)
	}
	return nil
}

// driveUntilFailed runs sc's progress, without reading, until the
// connection has failed or within has passed; it tells which.
func driveUntilFailed(sc *Conn, within time.Duration) bool {
	for end := time.Now().Add(within); time.Now().Before(end); {
		sc.mu.Lock()
		failed, gen := sc.err != nil || sc.qpDead, sc.rounds
		sc.mu.Unlock()
		if failed {
			return true
		}
		var dl deadline
		dl.init()
		dl.set(time.Now().Add(10 * time.Millisecond))
		sc.progress(gen, &dl, false)
		dl.set(time.Time{})
	}
	return false
}

// attack is a lie of a peer that speaks the protocol: victim, if set, is
// what the honest side does meanwhile (in its own goroutine); lie runs on
// the liar's connection and returns a check to run once the victim has
// aborted (guard bytes of the liar's memory), or nil. The same attacks run
// in one process (TestPeerValidation) and across processes
// (TestCampaignHostilePeer).
type attack struct {
	name   string
	cfg    *Config
	split  bool // the victim splits transfers on any memory (splitAnyMemory)
	reason string
	victim func(good net.Conn)
	lie    func(bad *Conn) (check func() error, err error)
	// whole: the victim reads only once the lie is all sent. A flood
	// without credit shows as such only when the victim takes it in one
	// go; a victim that reads while it comes acknowledges what it read,
	// which makes the rest of the flood look credited.
	whole bool
}

// say that lie sends h and payload and needs no check.
func sendOnly(h header, payload []byte) func(bad *Conn) (func() error, error) {
	return func(bad *Conn) (func() error, error) { return nil, rawSendErr(bad, h, payload) }
}

func hdr(t msgType, set func(h *header)) header {
	var h header
	h.SetType(t)
	if set != nil {
		set(&h)
	}
	return h
}

var attacks = []attack{
	{name: "malformed", reason: "reserved header field", lie: sendOnly(hdr(msgData, func(h *header) { h[offReserved] = 1 }), []byte("x"))},
	{name: "unknown type", reason: "unknown message type", lie: sendOnly(hdr(msgLast+1, nil), nil)},
	{name: "wrong length", reason: "header says 100 payload bytes, message has 10", lie: func(bad *Conn) (func() error, error) {
		h := hdr(msgData, nil)
		h.SetLen(100)
		return nil, rawPost(bad, append(h[:], make([]byte, 10)...))
	}},
	{name: "no credit", reason: "without credit", lie: func(bad *Conn) (func() error, error) {
		for i := 0; i < int(bad.peerWindow); i++ {
			if err := rawSendErr(bad, hdr(msgData, nil), []byte("flood")); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}, whole: true},
	// A data message of more than one message's payload counts two
	// credits: with three left, a one-credit message would pass (the
	// last two are kept for control and credit messages), this one not.
	{name: "two units without credit", reason: "without credit", lie: func(bad *Conn) (func() error, error) {
		for i := 0; i < int(bad.peerWindow)-3; i++ {
			if err := rawSendErr(bad, hdr(msgData, nil), []byte("flood")); err != nil {
				return nil, err
			}
		}
		return nil, rawSendErr(bad, hdr(msgData, nil), make([]byte, bad.maxPayload+1))
	}, whole: true},
	{name: "data past two units", reason: "larger than the", lie: func(bad *Conn) (func() error, error) {
		h := hdr(msgData, nil)
		h.SetLen(uint32(bad.maxData + 1))
		return nil, rawPost(bad, append(h[:], make([]byte, bad.maxData+1)...))
	}},
	{name: "short past two units", reason: "larger than the", lie: func(bad *Conn) (func() error, error) {
		return nil, rawPost(bad, append([]byte{byte(msgShort), 0, 0, 0, 0, 0, 0, 0}, make([]byte, bad.maxData+1)...))
	}},
	{name: "two units in version 5", cfg: &Config{versions: [2]uint16{1, 5}}, reason: "larger than the", lie: func(bad *Conn) (func() error, error) {
		return nil, rawPost(bad, append([]byte{byte(msgShort), 0, 0, 0, 0, 0, 0, 0}, make([]byte, bad.maxPayload+headerSize)...))
	}},
	{name: "ack of unsent", reason: "never sent", lie: func(bad *Conn) (func() error, error) {
		bad.mu.Lock()
		bad.consumed += 1000
		bad.mu.Unlock()
		err := rawSendErr(bad, hdr(msgCredit, nil), nil)
		bad.mu.Lock()
		bad.consumed -= 1000
		bad.ackSent.store(bad.ackSent.load() - 1000)
		bad.mu.Unlock()
		return nil, err
	}},
	{name: "bad descriptor", reason: "outside its registrations", lie: func(bad *Conn) (func() error, error) {
		return nil, rawSendErr(bad, hdr(msgRTS, func(h *header) {
			h.SetFlags(flagRead)
			h.SetSize(1 << 20)
			h.SetID(bad.nextTx)
			h.SetAddr(uint64(bad.bellMR.Addr) + 1<<20) // ours, but not exposed
			h.SetRKey(bad.bellMR.RKey)                 // a real key of another region
		}), []byte("inline"))
	}},
	{name: "source past its region", reason: "outside its registrations", lie: func(bad *Conn) (func() error, error) {
		src := newGuarded(64 << 10)
		mr, err := bad.dev.register(bad.owner, src.mid, nic.AccessRemoteRead)
		if err != nil {
			return nil, err
		}
		err = rawSendErr(bad, hdr(msgRTS, func(h *header) {
			h.SetFlags(flagRead)
			h.SetSize(64 << 10)
			h.SetAddr(uint64(mr.Addr) + 4096) // the last 4 KiB lie beyond it
			h.SetRKey(mr.RKey)
		}), []byte("inline"))
		return func() error { bad.dev.nic.Deregister(mr); return nil }, err
	}},
	{name: "revoked source", reason: "outside its registrations", lie: func(bad *Conn) (func() error, error) {
		src := newGuarded(64 << 10)
		mr, err := bad.dev.register(bad.owner, src.mid, nic.AccessRemoteRead)
		if err != nil {
			return nil, err
		}
		bad.dev.nic.Deregister(mr)
		return nil, rawSendErr(bad, hdr(msgRTS, func(h *header) {
			h.SetFlags(flagRead)
			h.SetSize(64 << 10)
			h.SetAddr(uint64(mr.Addr))
			h.SetRKey(mr.RKey)
		}), []byte("inline"))
	}},
	{name: "bad write sink", cfg: &Config{NoRDMARead: true}, reason: "outside its registrations",
		// good writes to bad by write rendezvous; bad answers with a sink
		// it never registered.
		victim: func(good net.Conn) { good.Write(make([]byte, 1<<20)) },
		lie: func(bad *Conn) (func() error, error) {
			if err := awaitRx(bad, 1); err != nil {
				return nil, err
			}
			return nil, rawSendErr(bad, hdr(msgCTS, func(h *header) {
				h.SetSize(64 << 10)
				h.SetAddr(uint64(bad.bellMR.Addr))
				h.SetRKey(0xdead << 24)
			}), nil)
		}},
	{name: "sink past its region", cfg: &Config{NoRDMARead: true}, reason: "outside its registrations",
		victim: func(good net.Conn) { good.Write(make([]byte, 1<<20)) },
		lie: func(bad *Conn) (func() error, error) {
			sink, mr, err := lyingSink(bad)
			if err != nil {
				return nil, err
			}
			err = rawSendErr(bad, hdr(msgCTS, func(h *header) {
				h.SetSize(64 << 10)
				h.SetAddr(uint64(mr.Addr) + 4096) // the last 4 KiB lie beyond it
				h.SetRKey(mr.RKey)
			}), nil)
			return func() error {
				bad.dev.nic.Deregister(mr)
				return sink.intact(false)
			}, err
		}},
	{name: "revoked write sink", cfg: &Config{NoRDMARead: true}, reason: "outside its registrations",
		victim: func(good net.Conn) { good.Write(make([]byte, 1<<20)) },
		lie: func(bad *Conn) (func() error, error) {
			sink, mr, err := lyingSink(bad)
			if err != nil {
				return nil, err
			}
			bad.dev.nic.Deregister(mr)
			err = rawSendErr(bad, hdr(msgCTS, func(h *header) {
				h.SetSize(64 << 10)
				h.SetAddr(uint64(mr.Addr))
				h.SetRKey(mr.RKey)
			}), nil)
			// After revocation no byte moves: the sink too is untouched.
			return func() error { return sink.intact(true) }, err
		}},
	{name: "out-of-order done", reason: "out-of-order done",
		// good has two copied transfers outstanding; bad says done for
		// the second first.
		victim: func(good net.Conn) {
			for i := 0; i < 2; i++ {
				if _, err := good.Write(make([]byte, good.(*Conn).cfg.EagerThreshold+1)); err != nil {
					return
				}
			}
		},
		lie: func(bad *Conn) (func() error, error) {
			if err := awaitRx(bad, 2); err != nil {
				return nil, err
			}
			return nil, rawSendErr(bad, hdr(msgDone, func(h *header) {
				h.SetID(1)
				h.SetSize(uint32(bad.cfg.EagerThreshold + 1 - bad.maxPayload))
			}), nil)
		}},
	{name: "done of nothing", reason: "none outstanding", lie: sendOnly(hdr(msgDone, func(h *header) { h.SetID(7); h.SetSize(100) }), nil)},
	{name: "cts of nothing", reason: "not in progress", lie: sendOnly(hdr(msgCTS, func(h *header) { h.SetID(3); h.SetSize(100); h.SetRKey(1) }), nil)},
	{name: "rts out of sequence", reason: "expected 0", lie: sendOnly(hdr(msgRTS, func(h *header) { h.SetID(5); h.SetSize(100) }), []byte("x"))},
	{name: "split rts in version 2", cfg: &Config{versions: [2]uint16{1, 2}}, reason: "split rts in version 2", lie: func(bad *Conn) (func() error, error) {
		src := newGuarded(64 << 10)
		mr, err := bad.dev.register(bad.owner, src.mid, nic.AccessRemoteRead)
		if err != nil {
			return nil, err
		}
		err = rawSendErr(bad, hdr(msgRTS, func(h *header) {
			h.SetFlags(flagRead | flagSplit)
			h.SetSize(64 << 10)
			h.SetAddr(uint64(mr.Addr))
			h.SetRKey(mr.RKey)
		}), []byte("inline"))
		return func() error { bad.dev.nic.Deregister(mr); return nil }, err
	}},
	{name: "split cts of nothing", reason: "not a split transfer in progress", lie: sendOnly(hdr(msgCTS, func(h *header) {
		h.SetFlags(flagSplit)
		h.SetID(3)
		h.SetOffset(4096)
		h.SetSize(4096)
		h.SetAddr(4096)
		h.SetRKey(1)
	}), nil)},
	{name: "split done of nothing", reason: "split done of transfer 7", lie: sendOnly(hdr(msgDone, func(h *header) {
		h.SetFlags(flagSplit)
		h.SetID(7)
		h.SetOffset(4096)
		h.SetSize(4096)
	}), nil)},
	// good offers its second write as a split transfer (its first, from a
	// buffer new to it, is copied); bad answers with a tail that does not
	// reach the end, a cts without flagSplit, or two tails.
	{name: "split tail out of range", cfg: splitCfg, split: true, reason: "split cts [0, +", victim: splitVictim,
		lie: ctsForSplitOffer(flagSplit)},
	{name: "plain cts for a split transfer", cfg: splitCfg, split: true, reason: "cts without flagSplit for read transfer 1", victim: splitVictim,
		lie: ctsForSplitOffer(0)},
	{name: "second split cts", cfg: splitCfg, split: true, reason: "second split cts for transfer 1", victim: splitVictim,
		lie: func(bad *Conn) (func() error, error) {
			size, err := awaitSplitOffer(bad)
			if err != nil {
				return nil, err
			}
			// A real sink for the tail: good writes it, then hears of a
			// second tail.
			half := size / 2 &^ 4095
			sink := newGuarded(int(size - half))
			mr, err := bad.dev.register(bad.owner, sink.mid, nic.AccessLocalWrite|nic.AccessRemoteWrite)
			if err != nil {
				return nil, err
			}
			cts := hdr(msgCTS, func(h *header) {
				h.SetFlags(flagSplit)
				h.SetID(1)
				h.SetOffset(half)
				h.SetSize(size - half)
				h.SetAddr(uint64(mr.Addr))
				h.SetRKey(mr.RKey)
			})
			// bad's own checks must take good's done for the tail: it
			// plays a receiver with that tail outstanding.
			bad.mu.Lock()
			bad.rd = recvOp{active: true, read: true, direct: true, split: true, readDone: true, id: 1, tailOff: half, tailLen: size - half}
			bad.mu.Unlock()
			for range 2 {
				if err := rawSendErr(bad, cts, nil); err != nil {
					return nil, err
				}
			}
			return func() error {
				bad.dev.nic.Deregister(mr)
				return sink.intact(false) // the tail landed inside it, not around
			}, nil
		}},
	// Version 4: the sender of a write rendezvous marks the done of each
	// chunk it wrote; one with no sink outstanding, or before version 4,
	// is a lie.
	{name: "chunk done of nothing", reason: "chunk done of transfer 7, no sink", lie: sendOnly(hdr(msgDone, func(h *header) {
		h.SetFlags(flagChunk)
		h.SetID(7)
		h.SetSize(4096)
	}), nil)},
	{name: "chunk done in version 3", cfg: &Config{versions: [2]uint16{1, 3}}, reason: "done with flags 0x8 in version 3", lie: sendOnly(hdr(msgDone, func(h *header) {
		h.SetFlags(flagChunk)
		h.SetSize(4096)
	}), nil)},
	{name: "short data in version 4", cfg: &Config{versions: [2]uint16{1, 4}}, reason: "short data in version 4", lie: func(bad *Conn) (func() error, error) {
		return nil, rawPost(bad, []byte{byte(msgShort), 0, 0, 0, 0, 0, 0, 0, 'x'})
	}},
	{name: "empty short", reason: "empty short message", lie: func(bad *Conn) (func() error, error) {
		return nil, rawPost(bad, []byte{byte(msgShort), 0, 0, 0, 0, 0, 0, 0})
	}},
	{name: "second hello", reason: "second hello", lie: func(bad *Conn) (func() error, error) {
		bad.mu.Lock()
		defer bad.mu.Unlock()
		return nil, bad.sendHelloLocked()
	}},
}

func TestPeerValidation(t *testing.T) {
	// A bystander connection keeps working through all of it.
	by1, by2 := pipe(t, nil, nil)
	for _, tc := range attacks {
		t.Run(tc.name, func(t *testing.T) {
			if tc.split {
				splitAnyMemory(t)
			}
			bad, good := pipe(t, tc.cfg, tc.cfg)
			if tc.victim != nil {
				go tc.victim(good)
			}
			check, err := tc.lie(bad.(*Conn))
			if err != nil {
				t.Fatal(err)
			}
			expectAbort(t, good, bad, tc.reason)
			if check != nil {
				if err := check(); err != nil {
					t.Fatalf("liar's memory: %v", err)
				}
			}
		})
	}
	// The bystander still works.
	go by1.Write([]byte("still here"))
	buf := make([]byte, 10)
	if _, err := io.ReadFull(by2, buf); err != nil || string(buf) != "still here" {
		t.Fatalf("bystander: %q, %v", buf, err)
	}
}

// TestGracefulEOF checks io.EOF after a graceful close, on both sides of
// a half close, and that Close releases everything (TestMain checks fds
// and mappings).
func TestGracefulEOF(t *testing.T) {
	c, s := pipe(t, nil, nil)
	go func() {
		c.Write([]byte("last words"))
		c.Close()
	}()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "last words" {
		t.Fatalf("%q, %v", got, err)
	}
	if n, err := s.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read after EOF: %d, %v", n, err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	// Writes still go the other way until the peer is gone.
	s.Close()
	waitTorn(t, c)
	waitTorn(t, s)
}

func TestHalfClose(t *testing.T) {
	c, s := pipe(t, nil, nil)
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*Conn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("more")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	req, err := io.ReadAll(s)
	if err != nil || string(req) != "request" {
		t.Fatalf("%q, %v", req, err)
	}
	if _, err := s.Write([]byte("response")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	resp, err := io.ReadAll(c)
	if err != nil || string(resp) != "response" {
		t.Fatalf("%q, %v", resp, err)
	}
}

// splitCfg makes 512 KiB writes split transfers (on any memory, with
// splitAnyMemory).
var splitCfg = &Config{SplitMin: 16 << 10, WaitedChunk: -1} // one rendezvous a write

// splitVictim writes twice from one buffer: the second write is offered
// as a split transfer.
func splitVictim(good net.Conn) {
	b := make([]byte, 512<<10)
	for range 2 {
		if _, err := good.Write(b); err != nil {
			return
		}
	}
}

// awaitSplitOffer waits for splitVictim's two rts and returns the size of
// the second, the split offer.
func awaitSplitOffer(bad *Conn) (uint32, error) {
	if err := awaitRx(bad, 2); err != nil {
		return 0, err
	}
	bad.mu.Lock()
	defer bad.mu.Unlock()
	e := bad.rx[bad.rxHead+1]
	if !e.split {
		return 0, fmt.Errorf("second rts not a split offer: %+v", e)
	}
	return e.size, nil
}

// ctsForSplitOffer answers splitVictim's split offer with a cts of the
// flags for the whole transfer from offset 0: with flagSplit a tail that
// starts at 0, without it a plain cts for a read rendezvous.
func ctsForSplitOffer(flags uint8) func(bad *Conn) (func() error, error) {
	return func(bad *Conn) (func() error, error) {
		size, err := awaitSplitOffer(bad)
		if err != nil {
			return nil, err
		}
		return nil, rawSendErr(bad, hdr(msgCTS, func(h *header) {
			h.SetFlags(flags)
			h.SetID(1)
			h.SetSize(size)
			h.SetAddr(4096)
			h.SetRKey(1)
		}), nil)
	}
}

// lyingSink waits until bad has received the victim's rts, then registers
// a guarded 64 KiB sink for remote write: the region a lying cts names.
func lyingSink(bad *Conn) (guarded, *nic.MemoryRegion, error) {
	if err := awaitRx(bad, 1); err != nil {
		return guarded{}, nil, err
	}
	sink := newGuarded(64 << 10)
	mr, err := bad.dev.register(bad.owner, sink.mid, nic.AccessLocalWrite|nic.AccessRemoteWrite)
	return sink, mr, err
}
