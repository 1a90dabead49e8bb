package nic

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// TestPrivateData: what the dialer sends with its hello reaches the
// listener's Answer and its queue pair, what Answer returns reaches the
// dialer's, and an Answer that fails refuses the dialer with its reason.
func TestPrivateData(t *testing.T) {
	for _, c := range []struct {
		name       string
		dialer     []byte
		answer     func([]byte) ([]byte, error)
		reply      []byte // the listener's PrivateData, without an Answer
		wantReply  []byte
		wantRefuse string // the dialer is refused with this in the reason
	}{
		{name: "none"},
		{name: "both ways", dialer: []byte("request"), reply: []byte("static reply"), wantReply: []byte("static reply")},
		{name: "largest", dialer: bytes.Repeat([]byte{1}, MaxPrivateData), reply: bytes.Repeat([]byte{2}, MaxPrivateData), wantReply: bytes.Repeat([]byte{2}, MaxPrivateData)},
		{name: "answered", dialer: []byte("ping"), reply: []byte("unused"),
			answer:    func(b []byte) ([]byte, error) { return append([]byte("re: "), b...), nil },
			wantReply: []byte("re: ping")},
		{name: "answer refuses", dialer: []byte("v9"),
			answer:     func(b []byte) ([]byte, error) { return nil, errors.New("no session version in common") },
			wantRefuse: "no session version in common"},
		{name: "answer too long", answer: func([]byte) ([]byte, error) { return make([]byte, MaxPrivateData+1), nil },
			wantRefuse: "201 bytes of private data"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := openDevice(t, nil), openDevice(t, nil)
			ln, err := b.Listen(testAddr())
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			type result struct {
				qp  *QueuePair
				err error
			}
			accepted := make(chan result, 1)
			var seen []byte
			go func() {
				answer := c.answer
				if answer != nil {
					answer = func(d []byte) ([]byte, error) { seen = d; return c.answer(d) }
				}
				qp, err := ln.Accept(QPOptions{SendCQ: b.NewCQ(), RecvCQ: b.NewCQ(), PrivateData: c.reply, Answer: answer})
				accepted <- result{qp, err}
			}()
			qa, err := a.Dial(ln.Addr().String(), QPOptions{SendCQ: a.NewCQ(), RecvCQ: a.NewCQ(), PrivateData: c.dialer})
			r := <-accepted
			if c.wantRefuse != "" {
				if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.wantRefuse) {
					t.Fatalf("dial: %v, want refused with %q", err, c.wantRefuse)
				}
				if r.err == nil {
					r.qp.Close()
					t.Fatal("the listener accepted what its Answer refused")
				}
				return
			}
			if err != nil || r.err != nil {
				t.Fatalf("dial: %v; accept: %v", err, r.err)
			}
			defer qa.Close()
			defer r.qp.Close()
			if !bytes.Equal(qa.PeerPrivateData(), c.wantReply) {
				t.Errorf("the dialer got %q, want %q", qa.PeerPrivateData(), c.wantReply)
			}
			if !bytes.Equal(r.qp.PeerPrivateData(), c.dialer) {
				t.Errorf("the listener's queue pair got %q, want %q", r.qp.PeerPrivateData(), c.dialer)
			}
			if c.answer != nil && !bytes.Equal(seen, c.dialer) {
				t.Errorf("Answer saw %q, want %q", seen, c.dialer)
			}
		})
	}
	d := openDevice(t, nil)
	if _, err := d.Dial("@nowhere", QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), PrivateData: make([]byte, MaxPrivateData+1)}); err == nil || !strings.Contains(err.Error(), "private data") {
		t.Errorf("dial with too much private data: %v", err)
	}
}

// TestHostileHello: hand-made hellos from a dialer that is not ours —
// one of an older version, and malformed ones — are each refused with a
// reason that says what was wrong, and the listener keeps accepting.
func TestHostileHello(t *testing.T) {
	d := openDevice(t, nil)
	ln, err := d.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	good := d.hello(1<<16, nil)
	for _, c := range []struct {
		name  string
		hello []byte
		nfds  int
		want  string // in the reject's reason
	}{
		{"version 3", func() []byte { h := good; h.minVer, h.maxVer = 3, 3; return h.marshal() }(), cmRequestFds,
			"peer speaks versions [3, 3], we speak [4, 5]"},
		{"too much private data", append(good.marshal(), make([]byte, MaxPrivateData+1)...), cmRequestFds, "201 bytes of private data"},
		{"more than a hello holds", append(good.marshal(), make([]byte, cmMaxTail+1)...), cmRequestFds, "handshake of 265 bytes"},
		{"held files cut short", func() []byte { h := good; h.flags |= cmFlagHeld; return h.marshal()[:cmHelloSize+cmHeldSize-1] }(), cmRequestFds,
			"naming held files, with 31 bytes after it"},
		{"held files in version 4", func() []byte { h := good; h.flags |= cmFlagHeld; h.maxVer = 4; return h.marshal() }(), cmRequestFds,
			"held files flagged in a hello of versions [4, 4]"},
		{"too few fds", good.marshal(), 2, "with 2 fds, want 4"},
		{"no ring", func() []byte { h := good; h.ringCapacity = 0; return h.marshal() }(), cmRequestFds, "without a ring capacity"},
		{"a reject", rejectHello("confused").marshal(), cmRequestFds, "flagged as a reject"},
		{"reserved word", func() []byte { b := good.marshal(); binary.LittleEndian.PutUint32(b[helReservedOff:], 64); return b }(), cmRequestFds,
			"reserved handshake word 0x40"},
	} {
		t.Run(c.name, func(t *testing.T) {
			accepted := make(chan error, 1)
			go func() {
				qp, err := ln.Accept(QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ(), Timeout: 10 * time.Second})
				if err == nil {
					qp.Close()
				}
				accepted <- err
			}()
			reason := rawHello(t, ln.Addr().String(), c.hello, c.nfds)
			if !strings.Contains(reason, c.want) {
				t.Errorf("reject reason %q, want %q in it", reason, c.want)
			}
			if err := <-accepted; err == nil {
				t.Errorf("accepted a hostile hello")
			}
		})
	}
	// Still accepting.
	accepted := make(chan error, 1)
	go func() {
		qp, err := ln.Accept(QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ()})
		if err == nil {
			qp.Close()
		}
		accepted <- err
	}()
	qa, err := openDevice(t, nil).Dial(ln.Addr().String(), QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ()})
	if err == nil {
		qa.Close()
	}
	if aerr := <-accepted; err != nil || aerr != nil {
		t.Fatalf("after the hostile dialers: dial %v, accept %v", err, aerr)
	}
}

// rawHello connects to addr, sends hello with nfds fds (of /dev/null) as a
// dialer, and returns the reason of the reject it must get.
func rawHello(t *testing.T, addr string, hello []byte, nfds int) string {
	t.Helper()
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fds := make([]int, nfds)
	for i := range fds {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fds[i] = int(f.Fd())
	}
	if err := sys.SendFds(conn, hello, fds...); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, cmRecvSize)
	n, got, err := sys.RecvFds(conn, buf, cmMaxFds)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	sys.CloseAll(got)
	_, err = parseReply(buf[:n], len(got))
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("answer %v, want a reject", err)
	}
	return err.Error()
}
