package sockets

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// rawSend makes c send h and payload as they are, credits or not.
func rawSend(t *testing.T, c net.Conn, h header, payload []byte) {
	t.Helper()
	sc := c.(*Conn)
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if len(sc.sendFree) == 0 {
		t.Fatal("no free send buffer")
	}
	if err := sc.sendLocked(&h, payload); err != nil {
		t.Fatal(err)
	}
}

// expectAbort checks that victim aborts with ErrProtocol mentioning
// reason, and that the offender sees a reset, not EOF.
func expectAbort(t *testing.T, victim, offender net.Conn, reason string) {
	t.Helper()
	victim.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1<<20)
	var err error
	for err == nil {
		_, err = victim.Read(buf)
	}
	if !errors.Is(err, ErrProtocol) || !bytes.Contains([]byte(err.Error()), []byte(reason)) {
		t.Fatalf("victim: %v, want ErrProtocol with %q", err, reason)
	}
	offender.SetReadDeadline(time.Now().Add(10 * time.Second))
	for err = nil; err == nil; {
		_, err = offender.Read(buf)
	}
	if !errors.Is(err, syscall.ECONNRESET) || err == io.EOF {
		t.Fatalf("offender: %v, want a reset", err)
	}
	if _, err := victim.Write([]byte("x")); !errors.Is(err, ErrProtocol) {
		t.Fatalf("victim write after abort: %v", err)
	}
}

func TestPeerValidation(t *testing.T) {
	// A bystander connection keeps working through all of it.
	by1, by2 := pipe(t, nil, nil)
	for _, tc := range []struct {
		name   string
		cfg    *Config
		reason string
		attack func(t *testing.T, bad, good net.Conn)
	}{
		{"malformed", nil, "reserved header field", func(t *testing.T, bad, good net.Conn) {
			var h header
			h.SetType(msgData)
			h[offReserved] = 1
			rawSend(t, bad, h, []byte("x"))
		}},
		{"unknown type", nil, "unknown message type", func(t *testing.T, bad, good net.Conn) {
			var h header
			h.SetType(msgLast + 1)
			rawSend(t, bad, h, nil)
		}},
		{"no credit", nil, "without credit", func(t *testing.T, bad, good net.Conn) {
			sc := bad.(*Conn)
			for i := 0; i < int(sc.peerWindow); i++ {
				var h header
				h.SetType(msgData)
				rawSend(t, bad, h, []byte("flood"))
				sc.mu.Lock()
				sc.sendFree = append(sc.sendFree[:0], 0) // the nic copied it
				sc.mu.Unlock()
			}
		}},
		{"ack of unsent", nil, "never sent", func(t *testing.T, bad, good net.Conn) {
			sc := bad.(*Conn)
			sc.mu.Lock()
			sc.consumed += 1000
			sc.mu.Unlock()
			var h header
			h.SetType(msgCredit)
			rawSend(t, bad, h, nil)
			sc.mu.Lock()
			sc.consumed -= 1000
			sc.ackSent -= 1000
			sc.mu.Unlock()
		}},
		{"bad descriptor", nil, "outside its registrations", func(t *testing.T, bad, good net.Conn) {
			sc := bad.(*Conn)
			var h header
			h.SetType(msgRTS)
			h.SetFlags(flagRead)
			h.SetSize(1 << 20)
			h.SetID(sc.nextTx)
			h.SetAddr(uint64(sc.recvMR.Addr)) // ours, but not exposed
			h.SetRKey(sc.bellMR.RKey)         // a real key of another region
			rawSend(t, bad, h, []byte("inline"))
		}},
		{"bad write sink", &Config{NoRDMARead: true}, "outside its registrations", func(t *testing.T, bad, good net.Conn) {
			// good writes to bad by write rendezvous; bad answers with a
			// sink it never registered.
			go good.Write(make([]byte, 1<<20))
			sc := bad.(*Conn)
			deadline := time.Now().Add(5 * time.Second)
			for {
				sc.mu.Lock()
				n := len(sc.rx) - sc.rxHead
				sc.mu.Unlock()
				if n > 0 || time.Now().After(deadline) {
					break
				}
				bad.SetReadDeadline(time.Now().Add(time.Millisecond))
				bad.Read(nil)
				sc.mu.Lock()
				gen := sc.rounds
				sc.mu.Unlock()
				sc.progress(gen, nil, false)
			}
			var h header
			h.SetType(msgCTS)
			h.SetSize(64 << 10)
			h.SetAddr(uint64(sc.sendMR.Addr))
			h.SetRKey(0xdead << 24)
			rawSend(t, bad, h, nil)
		}},
		{"out-of-order done", nil, "out-of-order done", func(t *testing.T, bad, good net.Conn) {
			// good has two copied transfers outstanding; bad says done
			// for the second first.
			cfg := good.(*Conn).cfg
			for i := 0; i < 2; i++ {
				if _, err := good.Write(make([]byte, cfg.EagerThreshold+1)); err != nil {
					t.Fatal(err)
				}
			}
			var h header
			h.SetType(msgDone)
			h.SetID(1)
			h.SetSize(uint32(cfg.EagerThreshold + 1 - good.(*Conn).maxPayload))
			rawSend(t, bad, h, nil)
		}},
		{"done of nothing", nil, "none outstanding", func(t *testing.T, bad, good net.Conn) {
			var h header
			h.SetType(msgDone)
			h.SetID(7)
			h.SetSize(100)
			rawSend(t, bad, h, nil)
		}},
		{"cts of nothing", nil, "not in progress", func(t *testing.T, bad, good net.Conn) {
			var h header
			h.SetType(msgCTS)
			h.SetID(3)
			h.SetSize(100)
			h.SetRKey(1)
			rawSend(t, bad, h, nil)
		}},
		{"rts out of sequence", nil, "expected 0", func(t *testing.T, bad, good net.Conn) {
			var h header
			h.SetType(msgRTS)
			h.SetID(5)
			h.SetSize(100)
			rawSend(t, bad, h, []byte("x"))
		}},
		{"second hello", nil, "second hello", func(t *testing.T, bad, good net.Conn) {
			sc := bad.(*Conn)
			sc.mu.Lock()
			sc.sendHelloLocked()
			sc.mu.Unlock()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad, good := pipe(t, tc.cfg, tc.cfg)
			tc.attack(t, bad, good)
			expectAbort(t, good, bad, tc.reason)
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
	if cs := c.(*Conn); cs.recvMR != nil || cs.sendMR != nil || cs.bellMR != nil {
		t.Fatal("registrations left after teardown")
	}
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
