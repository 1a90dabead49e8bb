package sockets

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"unsafe"
)

func TestHeaderLayout(t *testing.T) {
	var h header
	if unsafe.Sizeof(h) != headerSize || headerSize != 40 {
		t.Fatalf("header is %d bytes", unsafe.Sizeof(h))
	}
	h.SetType(msgCTS)
	h.SetFlags(flagRead)
	h.SetAck(0x01020304)
	h.SetLen(5)
	h.SetID(6)
	h.SetSize(7)
	h.SetOffset(8)
	h.SetAddr(0x1122334455667788)
	h.SetRKey(0x99aabbccddeeff00)
	want := []byte{4, 1, 0, 0, 4, 3, 2, 1, 5, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0, 8, 0, 0, 0,
		0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99}
	if !bytes.Equal(h[:], want) {
		t.Fatalf("header bytes\n% x\nwant\n% x", h[:], want)
	}
	if h.Type() != msgCTS || h.Flags() != flagRead || h.Ack() != 0x01020304 || h.Len() != 5 || h.ID() != 6 ||
		h.Size() != 7 || h.Offset() != 8 || h.Addr() != 0x1122334455667788 || h.RKey() != 0x99aabbccddeeff00 {
		t.Fatalf("accessors: %v", &h)
	}
}

// validMessages returns one well-formed message of every type.
func validMessages() [][]byte {
	msg := func(t msgType, f func(h *header), payload []byte) []byte {
		var h header
		h.SetType(t)
		if f != nil {
			f(&h)
		}
		h.SetLen(uint32(len(payload)))
		return append(h[:], payload...)
	}
	var hel [helloSize]byte
	(&hello{minVer: 1, maxVer: 1, window: 8, bufSize: 4096, maxTransfer: 1 << 20}).put(hel[:])
	return [][]byte{
		msg(msgHello, func(h *header) { h.SetRKey(1) }, hel[:]),
		msg(msgData, nil, []byte("data")),
		msg(msgRTS, func(h *header) { h.SetID(1); h.SetSize(100) }, []byte("inline")),
		msg(msgRTS, func(h *header) { h.SetFlags(flagRead); h.SetSize(100); h.SetAddr(4096); h.SetRKey(9) }, nil),
		msg(msgCTS, func(h *header) { h.SetSize(100); h.SetAddr(4096); h.SetRKey(9) }, nil),
		msg(msgDone, func(h *header) { h.SetSize(100) }, nil),
		msg(msgCancel, func(h *header) { h.SetOffset(10) }, nil),
		msg(msgCredit, nil, nil),
		msg(msgFin, nil, nil),
		msg(msgAbort, nil, []byte("why")),
		// Split transfers (version 3): rts, the tail's cts, its done.
		msg(msgRTS, func(h *header) { h.SetFlags(flagRead | flagSplit); h.SetSize(8192); h.SetAddr(4096); h.SetRKey(9) }, nil),
		msg(msgCTS, func(h *header) {
			h.SetFlags(flagSplit)
			h.SetOffset(4096)
			h.SetSize(4096)
			h.SetAddr(8192)
			h.SetRKey(9)
		}, nil),
		msg(msgDone, func(h *header) { h.SetFlags(flagSplit); h.SetOffset(4096); h.SetSize(4096) }, nil),
		// Version 4: a written chunk of a write rendezvous.
		msg(msgDone, func(h *header) { h.SetFlags(flagChunk); h.SetOffset(4096); h.SetSize(4096) }, nil),
		// Version 5: short data, 8 header bytes.
		append([]byte{byte(msgShort), 0, 0, 0, 7, 0, 0, 0}, "data"...),
	}
}

// TestParseShort: a short data message is its type, flags, reserved and
// ack, then its payload; its length comes from the message's.
func TestParseShort(t *testing.T) {
	m := append([]byte{byte(msgShort), 0, 0, 0, 7, 0, 0, 0}, "hello"...)
	h, p, err := parseMessage(m)
	if err != nil || h.Type() != msgShort || h.Ack() != 7 || h.Len() != 5 || string(p) != "hello" {
		t.Fatalf("parse %x: %v, ack %d, len %d, payload %q, %v", m, h.Type(), h.Ack(), h.Len(), p, err)
	}
	for _, tc := range []struct {
		name string
		m    []byte
		want string
	}{
		{"empty", m[:shortHeaderSize], "empty short message"},
		{"flags", append([]byte{byte(msgShort), flagRead, 0, 0, 0, 0, 0, 0}, 'x'), "short with flags 0x1"},
		{"reserved", append([]byte{byte(msgShort), 0, 0, 1, 0, 0, 0, 0}, 'x'), "reserved header field 0x100"},
		{"truncated header", m[:3], "empty short message"},
	} {
		if _, _, err := parseMessage(tc.m); err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestParseMessage(t *testing.T) {
	for _, m := range validMessages() {
		if _, _, err := parseMessage(m); err != nil {
			t.Errorf("%x: %v", m[:1], err)
		}
	}
	bad := func(name string, m []byte, mutate func(b []byte) []byte) {
		b := mutate(bytes.Clone(m))
		if _, _, err := parseMessage(b); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	v := validMessages()
	bad("short", v[1], func(b []byte) []byte { return b[:headerSize-1] })
	bad("length", v[1], func(b []byte) []byte { return b[:len(b)-1] })
	bad("reserved", v[1], func(b []byte) []byte { b[offReserved+1] = 1; return b })
	bad("type 0", v[1], func(b []byte) []byte { b[offType] = 0; return b })
	bad("empty data", v[7], func(b []byte) []byte { b[offType] = byte(msgData); return b })
	bad("rts read no key", v[3], func(b []byte) []byte { binary.LittleEndian.PutUint64(b[offRKey:], 0); return b })
	bad("rts wraps", v[3], func(b []byte) []byte { binary.LittleEndian.PutUint64(b[offAddr:], ^uint64(0)-10); return b })
	bad("rts write with key", v[2], func(b []byte) []byte { binary.LittleEndian.PutUint64(b[offRKey:], 5); return b })
	bad("cts flags", v[4], func(b []byte) []byte { b[offFlags] = 1; return b })
	bad("done zero", v[5], func(b []byte) []byte { binary.LittleEndian.PutUint32(b[offSize:], 0); return b })
	bad("done unknown flag", v[5], func(b []byte) []byte { b[offFlags] = 0x80; return b })
	bad("rts split without read", v[10], func(b []byte) []byte { b[offFlags] = flagSplit; return b })
	bad("rts unknown flag", v[10], func(b []byte) []byte { b[offFlags] |= 0x80; return b })
	bad("cts split and read", v[11], func(b []byte) []byte { b[offFlags] |= flagRead; return b })
	bad("done staged and split", v[12], func(b []byte) []byte { b[offFlags] |= flagStaged; return b })
	bad("done chunk and split", v[13], func(b []byte) []byte { b[offFlags] |= flagSplit; return b })
	bad("done chunk and staged", v[13], func(b []byte) []byte { b[offFlags] |= flagStaged; return b })
	staged := bytes.Clone(v[5])
	staged[offFlags] = flagStaged
	if _, _, err := parseMessage(staged); err != nil {
		t.Errorf("done with flagStaged: %v", err)
	}
	bad("credit with id", v[7], func(b []byte) []byte { binary.LittleEndian.PutUint32(b[offID:], 1); return b })
	// Each field a data message does not use, set alone, is named.
	for _, f := range []struct {
		name string
		off  int
	}{{"id", offID}, {"size", offSize}, {"offset", offOffset}, {"addr", offAddr + 7}, {"rkey", offRKey + 7}} {
		b := bytes.Clone(v[1])
		b[f.off] = 1
		if _, _, err := parseMessage(b); err == nil || !strings.Contains(err.Error(), "non-zero "+f.name) {
			t.Errorf("data with %s set: %v, want an error naming the field", f.name, err)
		}
	}
	bad("hello short", v[0], func(b []byte) []byte {
		binary.LittleEndian.PutUint32(b[offLen:], helloSize-1)
		return b[:len(b)-1]
	})
	long := append(bytes.Clone(v[9][:headerSize]), make([]byte, maxReason+1)...)
	binary.LittleEndian.PutUint32(long[offLen:], maxReason+1)
	bad("abort reason", long, func(b []byte) []byte { return b })
}

func TestHelloAndVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b [2]uint16
		want uint16
		ok   bool
	}{
		{[2]uint16{1, 1}, [2]uint16{1, 1}, 1, true},
		{[2]uint16{1, 3}, [2]uint16{2, 5}, 3, true},
		{[2]uint16{1, 1}, [2]uint16{2, 2}, 0, false},
		{[2]uint16{3, 4}, [2]uint16{1, 2}, 0, false},
	} {
		v, ok := negotiate(tc.a[0], tc.a[1], tc.b[0], tc.b[1])
		if ok != tc.ok || ok && v != tc.want {
			t.Errorf("negotiate(%v, %v) = %d, %v", tc.a, tc.b, v, ok)
		}
	}
	// End to end: a dialer that speaks only version 7 is refused.
	ln, err := Listen("sandirect", testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := Config{versions: [2]uint16{7, 7}}
	d := Dialer{Config: &cfg}
	if c, err := d.Dial("sandirect", ln.Addr().String()); !errors.Is(err, ErrVersion) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial with version 7: %v, want ErrVersion", err)
	}
	// One that speaks only 1 gets 1; 1 to 2, 2; and so on; 1 to 7, 6.
	for _, tc := range []struct {
		versions [2]uint16
		want     uint16
	}{{[2]uint16{1, 1}, 1}, {[2]uint16{1, 2}, 2}, {[2]uint16{1, 3}, 3}, {[2]uint16{1, 4}, 4}, {[2]uint16{1, 5}, 5}, {[2]uint16{1, 7}, 6}} {
		cfg.versions = tc.versions
		go func() {
			if c, err := ln.Accept(); err == nil {
				defer c.Close()
				c.Read(make([]byte, 1))
			}
		}()
		c, err := d.Dial("sandirect", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if v := c.(*Conn).version; v != tc.want {
			t.Fatalf("versions %v: version %d, want %d", tc.versions, v, tc.want)
		}
		c.Close()
		waitTorn(t, c)
	}
}

func FuzzParseMessage(f *testing.F) {
	for _, m := range validMessages() {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, payload, err := parseMessage(b)
		if err != nil {
			return
		}
		// A message that passes is self-consistent.
		hl := headerSize
		if h.Type() == msgShort {
			hl = shortHeaderSize
		}
		if int(h.Len()) != len(payload) || len(b) != hl+len(payload) || len(payload) == 0 && h.Type() == msgShort {
			t.Fatalf("len %d, payload %d, message %d", h.Len(), len(payload), len(b))
		}
		if h.Type() < msgHello || h.Type() > msgLast {
			t.Fatalf("type %v accepted", h.Type())
		}
		if h.Type() == msgHello {
			parseHello(&h, payload) // must not panic
		}
		if (h.Type() == msgCTS || h.Type() == msgRTS && h.Flags()&flagRead != 0) && h.Addr()+uint64(h.Size()) < h.Addr() {
			t.Fatalf("wrapping descriptor accepted: %v", &h)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	for name, c := range map[string]Config{
		"buffer":   {BufferSize: 100},
		"window":   {Window: 2},
		"transfer": {MaxTransfer: 100},
		"chunk":    {CopyChunk: 1 << 30, MaxTransfer: 1 << 20},
		"zerocopy": {ZeroCopy: 7},
		"linger":   {Linger: -1},
	} {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestShortDataOnTheWire: a small Write goes as a short data message
// between two sides of version 5, and as a whole-header one to a side of
// version 4; either way the bytes arrive.
func TestShortDataOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    *Config
		typ    msgType
		header int
	}{
		{"version 5", nil, msgShort, shortHeaderSize},
		{"version 4", &Config{versions: [2]uint16{1, 4}}, msgData, headerSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := pipe(t, tc.cfg, nil)
			for _, pair := range [][2]net.Conn{{c, s}, {s, c}} {
				w, r := pair[0], pair[1].(*Conn)
				if _, err := w.Write([]byte("twelve bytes")); err != nil {
					t.Fatal(err)
				}
				// The Write returned with the message in the ring: take it
				// as a poller would, look at it, and hand it on.
				r.mu.Lock()
				r.polling = true
				msg, start, ok := r.nextMsgLocked()
				if ok {
					if msgType(msg[offType]) != tc.typ || len(msg) != tc.header+12 {
						t.Errorf("message %x: want type %v, %d bytes", msg, tc.typ, tc.header+12)
					}
					r.onRecvLocked(msg, start)
				}
				r.endPollLocked()
				r.mu.Unlock()
				if !ok {
					t.Fatal("no message in the ring after the Write")
				}
				buf := make([]byte, 12)
				if _, err := io.ReadFull(r, buf); err != nil || string(buf) != "twelve bytes" {
					t.Fatalf("read %q, %v", buf, err)
				}
			}
		})
	}
}
