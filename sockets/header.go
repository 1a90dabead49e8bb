package sockets

import (
	"encoding/binary"
	"fmt"
)

// The session protocol's wire format; docs/protocol.md is its
// specification. Every control message is one nic send: a 40-byte header,
// then Len bytes of payload.
//
//	 0       1       2               4
//	+-------+-------+---------------+-------------------------------+
//	| type  | flags | reserved (0)  | ack                           |  0
//	+-------+-------+---------------+-------------------------------+
//	| len                           | id                            |  8
//	+-------------------------------+-------------------------------+
//	| size                          | offset                        | 16
//	+-------------------------------+-------------------------------+
//	| addr                                                          | 24
//	+---------------------------------------------------------------+
//	| rkey                                                          | 32
//	+---------------------------------------------------------------+
//	| payload (len bytes)                                           | 40
//
// All fields are little endian.
const (
	offType     = 0                     // u8: msgType
	offFlags    = offType + 1           // u8: flags of the type
	offReserved = offFlags + 1          // u16: zero
	offAck      = offReserved + 2       // u32: messages of the peer consumed so far (wrapping)
	offLen      = offAck + 4            // u32: payload bytes after the header
	offID       = offLen + 4            // u32: transfer id (rts, cts, done, cancel)
	offSize     = offID + 4             // u32: rendezvous bytes (rts, cts, done)
	offOffset   = offSize + 4           // u32: chunk offset in the transfer (cts, done, cancel)
	offAddr     = offOffset + 4         // u64: descriptor address (rts with flagRead, cts, hello)
	offRKey     = offAddr + 8           // u64: descriptor key (rts with flagRead, cts, hello)
	headerSize  = offRKey + 8           // 40
	_           = uint(40 - headerSize) // headerSize is 40
	_           = uint(headerSize - 40)
)

// msgType is a control message's type.
type msgType uint8

const (
	msgHello  msgType = iota + 1 // first message each way: parameters and versions
	msgData                      // eager data: the payload is stream bytes
	msgRTS                       // a large write: inline first part, then size bytes by rendezvous
	msgCTS                       // write rendezvous: the receiver's sink for one chunk
	msgDone                      // rendezvous complete (read: whole transfer; write: one chunk)
	msgCancel                    // write rendezvous: the sender gives up the rest of a transfer
	msgCredit                    // nothing but the ack (may use the reserved credit)
	msgFin                       // end of this direction's stream (graceful close)
	msgAbort                     // the sender aborts the connection; payload: reason
	msgShort                     // eager data behind a short header (version 5): the payload is stream bytes
	msgLast   = msgShort
)

var msgNames = [...]string{
	msgHello: "hello", msgData: "data", msgRTS: "rts", msgCTS: "cts", msgDone: "done",
	msgCancel: "cancel", msgCredit: "credit", msgFin: "fin", msgAbort: "abort", msgShort: "short",
}

func (t msgType) String() string {
	if t >= 1 && t <= msgLast {
		return msgNames[t]
	}
	return fmt.Sprintf("msgType(%d)", uint8(t))
}

// Flags.
const (
	// flagRead on an rts: read rendezvous; addr and rkey name the source,
	// registered for remote read. Without it: write rendezvous.
	flagRead = 1 << 0
	// flagStaged on a done of a read rendezvous (version 2): the receiver
	// took some of the transfer through its staging buffer — its Reads
	// are smaller than its DirectRead — so a source registered in place
	// would not reach the application's buffer in one copy.
	flagStaged = 1 << 1
	// flagSplit (version 3) splits a read rendezvous between the two
	// sides. On an rts: the source is registered in place and the sender
	// will also RDMA-Write one tail of it into the receiver's buffer. On a
	// cts: that tail's sink (offset > 0, reaching the end of the
	// transfer). On a done from the sender: the tail is written.
	flagSplit = 1 << 2
	// flagChunk (version 4) on a done from the sender of a write
	// rendezvous: this chunk of the receiver's sink is written. Without
	// it, a done from a side that both receives our read rendezvous and
	// serves our sinks could mean either.
	flagChunk = 1 << 3
)

// hello payload:
//
//	 0 u16 min version | 2 u16 max version | 4 u32 window | 8 u32 buffer size
//	12 u32 flags (helloRead) | 16 u32 ring capacity (dialer; 0 from the acceptor)
//	20 u32 max transfer
//
// The header's addr and rkey name the sender's doorbell: 8 bytes it
// registered for remote write, never read (a zero-byte RDMA Write there
// completes locally and wakes a waiter of our own completion queue).
const (
	helMinVer   = 0
	helMaxVer   = helMinVer + 2
	helWindow   = helMaxVer + 2
	helBufSize  = helWindow + 4
	helFlags    = helBufSize + 4
	helRingCap  = helFlags + 4
	helMaxXfer  = helRingCap + 4
	helloSize   = helMaxXfer + 4 // 24
	helloRead   = 1 << 0         // this side performs RDMA Reads: send it read rendezvous
	maxReason   = 200            // bytes of an abort's reason
	minBufBytes = headerSize + helloSize
)

// Protocol versions this implementation speaks.
const (
	protoMinVersion = 1
	protoMaxVersion = 6 // 2: done may carry flagStaged; 3: split transfers (flagSplit); 4: flagChunk; 5: msgShort; 6: two-unit data
	// shortVersion is the first version with short data messages.
	shortVersion = 5
	// unitsVersion is the first version whose data messages may carry up
	// to two messages' payload, counted as two credits (unitsOf).
	unitsVersion = 6
)

// A short data message (msgShort, version 5) carries a header of the
// first 8 bytes only — type, flags (0), reserved (0), ack — and then its
// payload, the rest of the message: the nic's record says how long it is.
// Data is most of what small writes send, and its header's other 32 bytes
// are always zero: a short one is that much less to copy, check and move
// between the caches (docs/protocol.md, "Short data").
const shortHeaderSize = offLen // 8

// header is a control message's fixed-size header. Its accessors read
// and write the wire fields.
type header [headerSize]byte

func (h *header) Type() msgType  { return msgType(h[offType]) }
func (h *header) Flags() uint8   { return h[offFlags] }
func (h *header) Ack() uint32    { return binary.LittleEndian.Uint32(h[offAck:]) }
func (h *header) Len() uint32    { return binary.LittleEndian.Uint32(h[offLen:]) }
func (h *header) ID() uint32     { return binary.LittleEndian.Uint32(h[offID:]) }
func (h *header) Size() uint32   { return binary.LittleEndian.Uint32(h[offSize:]) }
func (h *header) Offset() uint32 { return binary.LittleEndian.Uint32(h[offOffset:]) }
func (h *header) Addr() uint64   { return binary.LittleEndian.Uint64(h[offAddr:]) }
func (h *header) RKey() uint64   { return binary.LittleEndian.Uint64(h[offRKey:]) }

func (h *header) SetType(t msgType)  { h[offType] = uint8(t) }
func (h *header) SetFlags(f uint8)   { h[offFlags] = f }
func (h *header) SetAck(v uint32)    { binary.LittleEndian.PutUint32(h[offAck:], v) }
func (h *header) SetLen(v uint32)    { binary.LittleEndian.PutUint32(h[offLen:], v) }
func (h *header) SetID(v uint32)     { binary.LittleEndian.PutUint32(h[offID:], v) }
func (h *header) SetSize(v uint32)   { binary.LittleEndian.PutUint32(h[offSize:], v) }
func (h *header) SetOffset(v uint32) { binary.LittleEndian.PutUint32(h[offOffset:], v) }
func (h *header) SetAddr(v uint64)   { binary.LittleEndian.PutUint64(h[offAddr:], v) }
func (h *header) SetRKey(v uint64)   { binary.LittleEndian.PutUint64(h[offRKey:], v) }
func (h *header) String() string {
	return fmt.Sprintf("%v flags=%#x ack=%d len=%d id=%d size=%d off=%d addr=%#x rkey=%#x",
		h.Type(), h.Flags(), h.Ack(), h.Len(), h.ID(), h.Size(), h.Offset(), h.Addr(), h.RKey())
}

// Fields of the header a message type may leave non-zero (msgRule.used).
const (
	fFlags uint8 = 1 << iota
	fID
	fSize
	fOffset
	fAddr
	fRKey
	fAll = fFlags | fID | fSize | fOffset | fAddr | fRKey
)

// payloadRule says what payload a message type carries.
type payloadRule uint8

const (
	payloadNone     payloadRule = iota // none
	payloadHello                       // exactly helloSize bytes
	payloadNonEmpty                    // at least one byte (data)
	payloadAny                         // any, as long as a buffer holds (rts: its inline part)
	payloadReason                      // at most maxReason bytes (abort)
)

// msgRule is what parseMessage checks of one message type: the fields it
// may use (the others must be zero), the flags it may carry, its payload,
// and the checks of its own that the fields need (nil: none).
type msgRule struct {
	used    uint8
	flags   uint8
	payload payloadRule
	check   func(h header) error // by value: a pointer through a func value escapes, and a message would allocate
}

// msgRules has a rule for every message type; a type without one is
// unknown.
var msgRules = [...]msgRule{
	msgHello:  {used: fAddr | fRKey, payload: payloadHello},
	msgData:   {payload: payloadNonEmpty},
	msgRTS:    {used: fFlags | fID | fSize | fAddr | fRKey, flags: flagRead | flagSplit, payload: payloadAny, check: checkRTS},
	msgCTS:    {used: fAll, flags: flagSplit, check: checkCTS},
	msgDone:   {used: fFlags | fID | fSize | fOffset, flags: flagStaged | flagSplit | flagChunk, check: checkDone},
	msgCancel: {used: fID | fOffset},
	msgCredit: {},
	msgFin:    {},
	msgAbort:  {payload: payloadReason},
	msgShort:  {payload: payloadNonEmpty}, // parsed by parseShort
}

// parseMessage decodes and checks one control message as received from the
// peer: the header must be well formed for its type (msgRules), and the
// payload as long as the header says. It never trusts a field it has not
// checked; the checks that need connection state (credits, ids, offsets)
// are the caller's.
func parseMessage(b []byte) (h header, payload []byte, err error) {
	if len(b) > 0 && msgType(b[offType]) == msgShort {
		return parseShort(b)
	}
	if len(b) < headerSize {
		return h, nil, fmt.Errorf("message of %d bytes, shorter than a header", len(b))
	}
	copy(h[:], b)
	n := h.Len()
	if uint64(n) != uint64(len(b)-headerSize) {
		return h, nil, fmt.Errorf("header says %d payload bytes, message has %d", n, len(b)-headerSize)
	}
	if r := binary.LittleEndian.Uint16(h[offReserved:]); r != 0 {
		return h, nil, fmt.Errorf("reserved header field %#x", r)
	}
	t := h.Type()
	if int(t) >= len(msgRules) || t == 0 {
		return h, nil, fmt.Errorf("unknown message type %d", uint8(t))
	}
	r := &msgRules[t]
	if err := r.checkPayload(t, n); err != nil {
		return h, nil, err
	}
	if f := h.Flags(); f&^r.flags != 0 {
		return h, nil, fmt.Errorf("%v with flags %#x", t, f)
	}
	if err := checkZero(t, &h, r.used); err != nil {
		return h, nil, err
	}
	if r.check != nil {
		if err := r.check(h); err != nil {
			return h, nil, err
		}
	}
	return h, b[headerSize:], nil
}

// parseShort is parseMessage of a short data message: h comes back as a
// whole header of type msgShort, its Len the payload's.
func parseShort(b []byte) (h header, payload []byte, err error) {
	ack, payload, err := shortFields(b)
	if err != nil {
		return h, nil, err
	}
	h.SetType(msgShort)
	h.SetAck(ack)
	h.SetLen(uint32(len(payload)))
	return h, payload, nil
}

// shortFields checks a short data message, b, and returns its ack and
// payload. The receive paths take these without a header: one rebuilt on
// the stack from stores of different widths, then copied as a whole, cost
// more than the short header saves (docs/performance.md, "Short data").
func shortFields(b []byte) (ack uint32, payload []byte, err error) {
	if len(b) <= shortHeaderSize {
		return 0, nil, fmt.Errorf("empty %v message", msgShort)
	}
	w := binary.LittleEndian.Uint64(b) // one load: b is the peer's to change
	if r := uint16(w >> 16); r != 0 {
		return 0, nil, fmt.Errorf("reserved header field %#x", r)
	}
	if f := uint8(w >> 8); f != 0 {
		return 0, nil, fmt.Errorf("%v with flags %#x", msgShort, f)
	}
	return uint32(w >> 32), b[shortHeaderSize:], nil
}

func (r *msgRule) checkPayload(t msgType, n uint32) error {
	switch r.payload {
	case payloadNone:
		if n != 0 {
			return fmt.Errorf("%v with a payload of %d bytes", t, n)
		}
	case payloadHello:
		if n != helloSize {
			return fmt.Errorf("hello of %d bytes", n)
		}
	case payloadNonEmpty:
		if n == 0 {
			return fmt.Errorf("empty %v message", t)
		}
	case payloadReason:
		if n > maxReason {
			return fmt.Errorf("abort reason of %d bytes", n)
		}
	}
	return nil
}

// checkZero checks that the fields a message type does not use are zero.
func checkZero(t msgType, h *header, used uint8) error {
	var nz uint8 // the fields that are not zero
	if h.ID() != 0 {
		nz |= fID
	}
	if h.Size() != 0 {
		nz |= fSize
	}
	if h.Offset() != 0 {
		nz |= fOffset
	}
	if h.Addr() != 0 {
		nz |= fAddr
	}
	if h.RKey() != 0 {
		nz |= fRKey
	}
	bad := nz &^ used
	if bad == 0 {
		return nil
	}
	for _, f := range fieldNames {
		if bad&f.bit != 0 {
			return fmt.Errorf("%v with non-zero %s", t, f.name)
		}
	}
	return nil
}

// fieldNames names the header fields of checkZero, in wire order.
var fieldNames = [...]struct {
	bit  uint8
	name string
}{{fID, "id"}, {fSize, "size"}, {fOffset, "offset"}, {fAddr, "addr"}, {fRKey, "rkey"}}

func checkRTS(h header) error {
	read := h.Flags()&flagRead != 0
	switch {
	case h.Flags() == flagSplit:
		return fmt.Errorf("rts flags %#x: a split transfer is a read rendezvous", h.Flags())
	case h.Size() == 0:
		return fmt.Errorf("rts of zero bytes")
	case read && h.RKey() == 0:
		return fmt.Errorf("read rts without a key")
	case read && h.Addr()+uint64(h.Size()) < h.Addr():
		return fmt.Errorf("read rts descriptor wraps the address space")
	case !read && (h.Addr() != 0 || h.RKey() != 0):
		return fmt.Errorf("write rts with non-zero addr/rkey")
	}
	return nil
}

func checkCTS(h header) error {
	switch {
	case h.Size() == 0 || h.RKey() == 0:
		return fmt.Errorf("cts without size or key")
	case h.Addr()+uint64(h.Size()) < h.Addr():
		return fmt.Errorf("cts descriptor wraps the address space")
	}
	return nil
}

func checkDone(h header) error {
	switch {
	case h.Flags()&(h.Flags()-1) != 0:
		return fmt.Errorf("done flags %#x: at most one of staged, split, chunk", h.Flags())
	case h.Size() == 0:
		return fmt.Errorf("done of zero bytes")
	}
	return nil
}

// hello is the decoded payload of a hello message.
type hello struct {
	minVer, maxVer uint16
	window         uint32
	bufSize        uint32
	flags          uint32
	ringCap        uint32
	maxTransfer    uint32
	bellAddr       uint64
	bellKey        uint64
}

func (m *hello) put(b []byte) {
	binary.LittleEndian.PutUint16(b[helMinVer:], m.minVer)
	binary.LittleEndian.PutUint16(b[helMaxVer:], m.maxVer)
	binary.LittleEndian.PutUint32(b[helWindow:], m.window)
	binary.LittleEndian.PutUint32(b[helBufSize:], m.bufSize)
	binary.LittleEndian.PutUint32(b[helFlags:], m.flags)
	binary.LittleEndian.PutUint32(b[helRingCap:], m.ringCap)
	binary.LittleEndian.PutUint32(b[helMaxXfer:], m.maxTransfer)
}

// parseHello decodes and checks a hello payload (parseMessage checked its
// length).
func parseHello(h *header, b []byte) (hello, error) {
	m := hello{
		minVer:      binary.LittleEndian.Uint16(b[helMinVer:]),
		maxVer:      binary.LittleEndian.Uint16(b[helMaxVer:]),
		window:      binary.LittleEndian.Uint32(b[helWindow:]),
		bufSize:     binary.LittleEndian.Uint32(b[helBufSize:]),
		flags:       binary.LittleEndian.Uint32(b[helFlags:]),
		ringCap:     binary.LittleEndian.Uint32(b[helRingCap:]),
		maxTransfer: binary.LittleEndian.Uint32(b[helMaxXfer:]),
		bellAddr:    h.Addr(),
		bellKey:     h.RKey(),
	}
	switch {
	case m.minVer == 0 || m.minVer > m.maxVer:
		return m, fmt.Errorf("hello versions [%d, %d]", m.minVer, m.maxVer)
	case m.window < minWindow || m.window > maxWindow:
		return m, fmt.Errorf("hello window %d outside [%d, %d]", m.window, minWindow, maxWindow)
	case m.bufSize < minBufferSize || m.bufSize > maxBufferSize:
		return m, fmt.Errorf("hello buffer size %d outside [%d, %d]", m.bufSize, minBufferSize, maxBufferSize)
	case m.flags&^helloRead != 0:
		return m, fmt.Errorf("hello flags %#x", m.flags)
	case m.maxTransfer < 4096 || m.maxTransfer > maxTransfer:
		return m, fmt.Errorf("hello max transfer %d", m.maxTransfer)
	case m.bellKey == 0:
		return m, fmt.Errorf("hello without a doorbell key")
	}
	return m, nil
}

// negotiate returns the highest version in both ranges.
func negotiate(aMin, aMax, bMin, bMax uint16) (uint16, bool) {
	v := min(aMax, bMax)
	return v, v >= max(aMin, bMin)
}
