package nic

import (
	"bytes"
	"errors"
	"github.com/sandirect/sandirect/shm"
	"testing"
)

// TestCMLayout pins the wire format: every field at the offset docs/nic.md
// gives, little endian, and the offsets adding up to the sizes.
func TestCMLayout(t *testing.T) {
	h := hello{minVer: 0x0102, maxVer: 0x0304, flags: 0x05060708, maxInline: 0x090a0b0c,
		maxRegions: 0x0d0e0f10, ringCapacity: 0x11121314, maxSend: 0x15161718}
	want := []byte{
		0x53, 0x44, 0x43, 0x4d, 0x02, 0x01, 0x04, 0x03, // "SDCM", min, max
		0x08, 0x07, 0x06, 0x05, 0x0c, 0x0b, 0x0a, 0x09, // flags, max inline
		0x10, 0x0f, 0x0e, 0x0d, 0x14, 0x13, 0x12, 0x11, // max regions, ring capacity
		0x18, 0x17, 0x16, 0x15, 0, 0, 0, 0, // max send, reserved
	}
	if got := h.marshal(); !bytes.Equal(got, want) {
		t.Fatalf("hello bytes\n% x\nwant\n% x", got, want)
	}
	r := rejectHello("why")
	if got := r.marshal(); len(got) != cmHelloSize+3 || string(got[cmHelloSize:]) != "why" {
		t.Fatalf("reject bytes % x", got)
	}
	h.private = []byte("data")
	if got := h.marshal(); !bytes.Equal(got, append(want, "data"...)) {
		t.Fatalf("hello with private data: % x", got)
	}
	// A dialer's hello naming held files: the block before the private data.
	h.flags = cmFlagHeld
	h.heldTable, h.heldHub = shm.FileID{Dev: 0x21, Ino: 0x22}, shm.FileID{Dev: 0x23, Ino: 0x24}
	held := append([]byte(nil), want...)
	held[helFlagsOff], held[helFlagsOff+1], held[helFlagsOff+2], held[helFlagsOff+3] = 2, 0, 0, 0
	for _, v := range []byte{0x21, 0x22, 0x23, 0x24} {
		held = append(held, v, 0, 0, 0, 0, 0, 0, 0)
	}
	if got := h.marshal(); !bytes.Equal(got, append(held, "data"...)) {
		t.Fatalf("hello with held files\n% x\nwant\n% x", got, append(held, "data"...))
	}
	h.ringCapacity = 0 // a reply: the flag alone
	if got := h.marshal(); len(got) != cmHelloSize+len("data") {
		t.Fatalf("reply flagged held: % x", got)
	}
	m := cmMsg{typ: cmSegDel, idx: 0x01020304}.marshal()
	if !bytes.Equal(m[:], []byte{3, 0, 0, 0, 4, 3, 2, 1}) {
		t.Fatalf("control message bytes % x", m)
	}
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"hello", cmHelloSize, 32},
		{"control message", cmMsgSize, 8},
		{"receive buffer", cmRecvSize, cmHelloSize + max(cmMaxReason, cmHeldSize+MaxPrivateData) + 1},
		{"held files", cmHeldSize, 32},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, c.got, c.want)
		}
	}
}

func TestParseHello(t *testing.T) {
	d := openDevice(t, nil)
	good := d.hello(1<<16, nil)
	if h, err := parseHello(good.marshal()); err != nil || h.attr() != d.Attr() || h.private != nil {
		t.Fatalf("round trip: %+v %v", h, err)
	}
	withData := d.hello(1<<16, bytes.Repeat([]byte{7}, MaxPrivateData))
	if h, err := parseHello(withData.marshal()); err != nil || !bytes.Equal(h.private, withData.private) {
		t.Fatalf("round trip with private data: %+v %v", h, err)
	}
	bad := func(f func(h *hello)) []byte { h := good; f(&h); return h.marshal() }
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"short", good.marshal()[:cmHelloSize-1]},
		{"magic", func() []byte { b := good.marshal(); b[helMagicOff] ^= 1; return b }()},
		{"versions", bad(func(h *hello) { h.minVer = 3; h.maxVer = 2 })},
		{"version 0", bad(func(h *hello) { h.minVer = 0 })},
		{"flags", bad(func(h *hello) { h.flags |= 1 << 5 })},
		{"regions", bad(func(h *hello) { h.maxRegions = 0 })},
		{"too many regions", bad(func(h *hello) { h.maxRegions = maxRegEntries + 1 })},
		{"ring", bad(func(h *hello) { h.ringCapacity = 1000 })},
		{"inline", bad(func(h *hello) { h.maxInline = h.maxSend + 1 })},
		{"too much private data", bad(func(h *hello) { h.private = make([]byte, MaxPrivateData+1) })},
		{"long reason", append(rejectHello("x").marshal(), make([]byte, cmMaxReason)...)},
		{"reserved set", func() []byte { b := good.marshal(); b[helReservedOff] = 1; return b }()},
	} {
		if _, err := parseHello(c.b); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want a protocol error", c.name, err)
		}
	}
	if h, err := parseHello(rejectHello("bad\x00\x1b[31m\xffuid").marshal()); err != nil || h.reason != "bad??[31m?uid" {
		t.Errorf("a reject's reason: %q, %v; want its unprintable bytes replaced", h.reason, err)
	}
}

func TestParseRequestReply(t *testing.T) {
	d := openDevice(t, nil)
	req, rep := d.hello(1<<16, nil), d.hello(0, nil)
	for _, c := range []struct {
		name  string
		reply bool
		b     []byte
		nfds  int
		want  error // nil: accepted
	}{
		{"request", false, req.marshal(), cmRequestFds, nil},
		{"request without ring capacity", false, rep.marshal(), cmRequestFds, ErrProtocol},
		{"request with too few fds", false, req.marshal(), cmRequestFds - 1, ErrProtocol},
		{"request with too many fds", false, req.marshal(), cmRequestFds + 1, ErrProtocol},
		{"request that is a reject", false, rejectHello("no").marshal(), cmRequestFds, ErrProtocol},
		{"reply", true, rep.marshal(), cmReplyFds, nil},
		{"reply with ring capacity", true, req.marshal(), cmReplyFds, ErrProtocol},
		{"reply with the request's fds", true, rep.marshal(), cmRequestFds, ErrProtocol},
		{"reject", true, rejectHello("uid 7 not allowed").marshal(), 0, ErrRefused},
		{"garbage reply", true, []byte("hello"), cmReplyFds, ErrProtocol},
	} {
		t.Run(c.name, func(t *testing.T) {
			parse := parseRequest
			if c.reply {
				parse = parseReply
			}
			_, err := parse(c.b, c.nfds)
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("%v, want %v", err, c.want)
			}
		})
	}
	if _, err := parseReply(rejectHello("uid 7 not allowed").marshal(), 0); err == nil || err.Error() != ErrRefused.Error()+" by peer: uid 7 not allowed" {
		t.Errorf("reject error %q does not carry the peer's reason", err)
	}
}

func TestParseCMMsg(t *testing.T) {
	msg := func(typ uint32) []byte { b := cmMsg{typ: typ, idx: 9}.marshal(); return b[:] }
	for _, c := range []struct {
		name    string
		b       []byte
		nfds    int
		version uint16
		ok      bool
	}{
		{"SEG_ADD", msg(cmSegAdd), 1, cmVersion, true},
		{"SEG_ADD without its fd", msg(cmSegAdd), 0, cmVersion, false},
		{"SEG_ADD with two fds", msg(cmSegAdd), 2, cmVersion, false},
		{"SEG_DENY", msg(cmSegDeny), 0, cmVersion, true},
		{"SEG_DENY with an fd", msg(cmSegDeny), 1, cmVersion, false},
		{"SEG_DEL", msg(cmSegDel), 0, cmVersion, true},
		{"SEG_DEL with an fd", msg(cmSegDel), 1, cmVersion, false},
		{"SEG_DEL from version 1", msg(cmSegDel), 0, 1, false},
		{"unknown type", msg(7), 0, cmVersion, false},
		{"type 0", msg(0), 0, cmVersion, false},
		{"short", msg(cmSegDeny)[:cmMsgSize-1], 0, cmVersion, false},
		{"long", append(msg(cmSegDeny), 0), 0, cmVersion, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := parseCMMsg(c.b, c.nfds, c.version)
			switch {
			case c.ok && (err != nil || m.idx != 9):
				t.Fatalf("%+v, %v", m, err)
			case !c.ok && !errors.Is(err, ErrProtocol):
				t.Fatalf("%+v, %v; want a protocol error", m, err)
			}
		})
	}
}

func TestNegotiate(t *testing.T) {
	if _, err := negotiate(hello{minVer: cmVersion + 1, maxVer: cmVersion + 4}); !errors.Is(err, ErrRefused) {
		t.Errorf("negotiate without a common version: %v", err)
	}
	for _, c := range []struct{ min, max, want uint16 }{{cmMinVersion, cmVersion, cmVersion}, {1, cmVersion, cmVersion}, {cmMinVersion, cmVersion + 4, cmVersion}} {
		if v, err := negotiate(hello{minVer: c.min, maxVer: c.max}); err != nil || v != c.want {
			t.Errorf("negotiate with a peer of versions [%d, %d]: %d, %v; want %d", c.min, c.max, v, err, c.want)
		}
	}
	// Versions before cmMinVersion lack what this one needs (wake hubs
	// since 3, private data since 4): a peer that speaks no later one is
	// refused.
	for v := uint16(1); v < cmMinVersion; v++ {
		if _, err := negotiate(hello{minVer: 1, maxVer: v}); !errors.Is(err, ErrRefused) {
			t.Errorf("negotiate with a peer of versions [1, %d]: %v, want refused", v, err)
		}
	}
}

// FuzzParseHello: a peer's hello either fails with a protocol error, or
// is accepted consistent and encodes back to the bytes that came.
func FuzzParseHello(f *testing.F) {
	d, err := Open(nil)
	if err != nil {
		f.Fatal(err)
	}
	defer d.Close()
	h := d.hello(1<<16, nil)
	f.Add(h.marshal())
	heldHello := d.hello(1<<16, []byte("private"))
	heldHello.flags |= cmFlagHeld
	heldHello.heldTable, heldHello.heldHub = shm.FileID{Dev: 1, Ino: 2}, shm.FileID{Dev: 3, Ino: 4}
	f.Add(heldHello.marshal())
	f.Add(d.hello(0, []byte("private")).marshal())
	f.Add(rejectHello("no").marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not match ErrProtocol", err)
			}
			return
		}
		if h.flags&cmFlagReject != 0 {
			if len(h.reason) > cmMaxReason { // a bad byte or rune becomes one '?'
				t.Fatalf("reason of %d bytes", len(h.reason))
			}
			return
		}
		if h.maxInline > h.maxSend || h.maxRegions > maxRegEntries || h.minVer > h.maxVer {
			t.Fatalf("accepted inconsistent hello %+v", h)
		}
		if got := h.marshal(); !bytes.Equal(got, b) {
			t.Fatalf("accepted % x, which encodes back as % x", b, got)
		}
		for _, nfds := range []int{0, cmReplyFds, cmRequestFds} {
			if _, err := parseRequest(b, nfds); err != nil && !errors.Is(err, ErrProtocol) {
				t.Fatalf("request with %d fds: %v", nfds, err)
			}
			if _, err := parseReply(b, nfds); err != nil && !errors.Is(err, ErrProtocol) {
				t.Fatalf("reply with %d fds: %v", nfds, err)
			}
		}
	})
}

// FuzzParseCMMsg: a control message is refused with a protocol error or
// accepted with the right fds, and encodes back to the bytes that came.
func FuzzParseCMMsg(f *testing.F) {
	for _, typ := range []uint32{cmSegAdd, cmSegDeny, cmSegDel, 0, 99} {
		b := cmMsg{typ: typ, idx: 3}.marshal()
		f.Add(b[:], uint8(typ&1), uint16(cmVersion))
	}
	f.Fuzz(func(t *testing.T, b []byte, nfds uint8, version uint16) {
		m, err := parseCMMsg(b, int(nfds), version)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not match ErrProtocol", err)
			}
			return
		}
		if (m.typ == cmSegAdd) != (nfds == 1) || m.typ == cmSegDel && version < 2 {
			t.Fatalf("accepted %+v with %d fds from version %d", m, nfds, version)
		}
		if got := m.marshal(); !bytes.Equal(got[:], b) {
			t.Fatalf("accepted % x, which encodes back as % x", b, got)
		}
	})
}
