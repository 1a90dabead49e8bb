package nic

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode"

	"github.com/sandirect/sandirect/shm"
)

// The connection manager's wire format; docs/nic.md is its specification.
// Every message is one SOCK_SEQPACKET datagram, little endian. What
// travels with it as SCM_RIGHTS is checked here too: the count of fds is
// part of each message's shape.
//
// hello, both ways (the dialer's request, the listener's reply or reject):
//
//	 0               4       6       8
//	+---------------+-------+-------+
//	| magic "SDCM"  | min v | max v |  0
//	+---------------+-------+-------+
//	| flags         | max inline    |  8
//	+---------------+---------------+
//	| max regions   | ring capacity | 16
//	+---------------+---------------+
//	| max send      | reserved (0)  | 24
//	+---------------+---------------+
//	| held files (a dialer's hello  | 32
//	| flagged cmFlagHeld only: 32 B)|
//	+-------------------------------+
//	| private data, or a reject's   |
//	| reason                        |
//
// Control messages after the handshake (SEG_ADD, SEG_DENY, SEG_DEL):
//
//	+---------------+---------------+
//	| type          | segment index |  0
//	+---------------+---------------+
const (
	helMagicOff    = 0                      // u32: cmMagic
	helMinVerOff   = helMagicOff + 4        // u16: lowest version spoken
	helMaxVerOff   = helMinVerOff + 2       // u16: highest version spoken
	helFlagsOff    = helMaxVerOff + 2       // u32: cmFlagRead, cmFlagReject
	helInlineOff   = helFlagsOff + 4        // u32: Attr.MaxInline
	helRegionsOff  = helInlineOff + 4       // u32: Attr.MaxRegions
	helRingCapOff  = helRegionsOff + 4      // u32: the dialer's ring capacity; 0 in a reply
	helMaxSendOff  = helRingCapOff + 4      // u32: Attr.MaxSend
	helReservedOff = helMaxSendOff + 4      // u32: zero
	cmHelloSize    = helReservedOff + 4     // 32; a reject's reason follows
	_              = uint(32 - cmHelloSize) // cmHelloSize is 32
	_              = uint(cmHelloSize - 32)

	msgTypeOff  = 0                   // u32: cmSegAdd, cmSegDeny, cmSegDel
	msgIndexOff = msgTypeOff + 4      // u32: the sender's memory segment index
	cmMsgSize   = msgIndexOff + 4     // 8
	_           = uint(8 - cmMsgSize) // cmMsgSize is 8
	_           = uint(cmMsgSize - 8)
)

const (
	cmMagic       = 0x4d434453 // "SDCM"
	cmVersion     = 5          // 2: SEG_DEL; 3: wake hubs; 4: private data; 5: held files
	cmMinVersion  = 4
	cmHeldVersion = 5   // the first that knows cmFlagHeld
	cmMaxReason   = 200 // bytes of a reject's reason
	// cmHeldSize is the held files' block: the listener's registration
	// table and hub table, each as device and inode, u64 each.
	cmHeldSize = 32
	// cmMaxTail is the most that follows a hello: the held files and
	// private data, or a reason.
	cmMaxTail = max(cmMaxReason, cmHeldSize+MaxPrivateData)

	cmFlagRead = 1 << 0 // this device initiates RDMA Reads
	// cmFlagHeld, in a dialer's hello (version 5): the dialer holds the
	// listener's registration table and hub from an earlier reply, and
	// names them in the held block; in the reply: the named files are
	// the listener's, and the reply comes without fds.
	cmFlagHeld   = 1 << 1
	cmFlagReject = 1 << 31 // a reject: the reason follows the hello

	cmSegAdd  = 1 // a memory segment, with its fd
	cmSegDeny = 2 // a memory segment not shared with this peer, no fd
	cmSegDel  = 3 // a memory segment freed, no fd (version 2)

	// fds passed with each hello: the dialer's queue-pair segment,
	// registration table, hub table and hub pipe; the reply's lacks the
	// queue-pair segment, and a reply flagged cmFlagHeld has none.
	cmRequestFds = 4
	cmReplyFds   = 3
	cmMaxFds     = cmRequestFds // a receive buffer's room for fds
	// cmRecvSize is a receive buffer for a hello: one byte more than the
	// largest, so that a longer datagram shows as such, not cut short.
	cmRecvSize = cmHelloSize + cmMaxTail + 1
)

// MaxPrivateData is the most private data a handshake carries each way
// (QPOptions.PrivateData).
const MaxPrivateData = 200

// hello is the handshake message, both ways.
type hello struct {
	minVer, maxVer uint16
	flags          uint32
	maxInline      uint32
	maxRegions     uint32
	ringCapacity   uint32 // the dialer's queue pair segment; 0 in the reply
	maxSend        uint32
	// The listener's files the dialer holds (a request flagged
	// cmFlagHeld): its registration table and its hub table.
	heldTable, heldHub shm.FileID
	private            []byte // the application's, opaque here (QPOptions.PrivateData)
	reason             string // a reject's reason
}

// heldBlock tells whether a hello carries the held files: a request
// (ring capacity set) flagged cmFlagHeld.
func (h *hello) heldBlock() bool {
	return h.flags&cmFlagHeld != 0 && h.flags&cmFlagReject == 0 && h.ringCapacity != 0
}

func (h hello) marshal() []byte {
	b := make([]byte, cmHelloSize, cmHelloSize+cmHeldSize+len(h.reason)+len(h.private))
	binary.LittleEndian.PutUint32(b[helMagicOff:], cmMagic)
	binary.LittleEndian.PutUint16(b[helMinVerOff:], h.minVer)
	binary.LittleEndian.PutUint16(b[helMaxVerOff:], h.maxVer)
	binary.LittleEndian.PutUint32(b[helFlagsOff:], h.flags)
	binary.LittleEndian.PutUint32(b[helInlineOff:], h.maxInline)
	binary.LittleEndian.PutUint32(b[helRegionsOff:], h.maxRegions)
	binary.LittleEndian.PutUint32(b[helRingCapOff:], h.ringCapacity)
	binary.LittleEndian.PutUint32(b[helMaxSendOff:], h.maxSend)
	if h.flags&cmFlagReject != 0 {
		return append(b, h.reason...)
	}
	if h.heldBlock() {
		for _, id := range [2]shm.FileID{h.heldTable, h.heldHub} {
			b = binary.LittleEndian.AppendUint64(b, id.Dev)
			b = binary.LittleEndian.AppendUint64(b, id.Ino)
		}
	}
	return append(b, h.private...)
}

// rejectHello is the reject carrying reason, cut to cmMaxReason bytes.
func rejectHello(reason string) hello {
	if len(reason) > cmMaxReason {
		reason = reason[:cmMaxReason]
	}
	return hello{flags: cmFlagReject, reason: reason}
}

// parseHello decodes and validates a handshake message from a peer. A
// reject is returned as it came, with only its reason checked.
func parseHello(b []byte) (hello, error) {
	var h hello
	if len(b) < cmHelloSize || len(b) > cmHelloSize+cmMaxTail {
		return h, fmt.Errorf("%w: handshake of %d bytes", ErrProtocol, len(b))
	}
	if m := binary.LittleEndian.Uint32(b[helMagicOff:]); m != cmMagic {
		return h, fmt.Errorf("%w: handshake magic %#x", ErrProtocol, m)
	}
	h.minVer = binary.LittleEndian.Uint16(b[helMinVerOff:])
	h.maxVer = binary.LittleEndian.Uint16(b[helMaxVerOff:])
	h.flags = binary.LittleEndian.Uint32(b[helFlagsOff:])
	h.maxInline = binary.LittleEndian.Uint32(b[helInlineOff:])
	h.maxRegions = binary.LittleEndian.Uint32(b[helRegionsOff:])
	h.ringCapacity = binary.LittleEndian.Uint32(b[helRingCapOff:])
	h.maxSend = binary.LittleEndian.Uint32(b[helMaxSendOff:])
	if r := binary.LittleEndian.Uint32(b[helReservedOff:]); r != 0 {
		return h, fmt.Errorf("%w: reserved handshake word %#x", ErrProtocol, r)
	}
	tail := b[cmHelloSize:]
	if h.flags&cmFlagReject != 0 {
		if len(tail) > cmMaxReason {
			return h, fmt.Errorf("%w: reject reason of %d bytes", ErrProtocol, len(tail))
		}
		h.reason = printable(string(tail))
		return h, nil
	}
	if h.heldBlock() {
		if len(tail) < cmHeldSize {
			return h, fmt.Errorf("%w: a hello flagged as naming held files, with %d bytes after it", ErrProtocol, len(tail))
		}
		u := func(i int) uint64 { return binary.LittleEndian.Uint64(tail[8*i:]) }
		h.heldTable, h.heldHub = shm.FileID{Dev: u(0), Ino: u(1)}, shm.FileID{Dev: u(2), Ino: u(3)}
		tail = tail[cmHeldSize:]
	}
	if len(tail) > MaxPrivateData {
		return h, fmt.Errorf("%w: %d bytes of private data", ErrProtocol, len(tail))
	}
	if len(tail) > 0 {
		h.private = append([]byte(nil), tail...)
	}
	switch {
	case h.minVer == 0 || h.minVer > h.maxVer:
		return h, fmt.Errorf("%w: versions [%d, %d]", ErrProtocol, h.minVer, h.maxVer)
	case h.flags&^(cmFlagRead|cmFlagHeld) != 0:
		return h, fmt.Errorf("%w: unknown flags %#x", ErrProtocol, h.flags)
	case h.flags&cmFlagHeld != 0 && h.maxVer < cmHeldVersion:
		return h, fmt.Errorf("%w: held files flagged in a hello of versions [%d, %d]", ErrProtocol, h.minVer, h.maxVer)
	case h.maxRegions == 0 || h.maxRegions > maxRegEntries:
		return h, fmt.Errorf("%w: %d regions", ErrProtocol, h.maxRegions)
	case h.maxSend > shm.MaxRingCapacity || h.maxInline > h.maxSend:
		return h, fmt.Errorf("%w: max send %d, inline %d", ErrProtocol, h.maxSend, h.maxInline)
	case h.ringCapacity != 0 && !validRingCapacity(h.ringCapacity):
		return h, fmt.Errorf("%w: ring capacity %d", ErrProtocol, h.ringCapacity)
	}
	return h, nil
}

func validRingCapacity(c uint32) bool {
	return c >= shm.MinRingCapacity && c <= shm.MaxRingCapacity && c&(c-1) == 0
}

// printable replaces what a terminal or a log would not show as text in
// a peer's reason.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
}

// parseRequest decodes a dialer's hello that came with nfds fds: a
// queue-pair segment's ring capacity, the request's fds, no reject.
func parseRequest(b []byte, nfds int) (hello, error) {
	h, err := parseHello(b)
	switch {
	case err != nil:
		return h, err
	case h.flags&cmFlagReject != 0:
		return h, fmt.Errorf("%w: a dialer's hello flagged as a reject", ErrProtocol)
	case h.ringCapacity == 0:
		return h, fmt.Errorf("%w: a dialer's hello without a ring capacity", ErrProtocol)
	case nfds != cmRequestFds:
		return h, fmt.Errorf("%w: a dialer's hello with %d fds, want %d", ErrProtocol, nfds, cmRequestFds)
	}
	return h, nil
}

// parseReply decodes the listener's answer that came with nfds fds: a
// reject is an error matching ErrRefused with the listener's reason.
func parseReply(b []byte, nfds int) (hello, error) {
	h, err := parseHello(b)
	switch {
	case err != nil:
		return h, err
	case h.flags&cmFlagReject != 0:
		return h, fmt.Errorf("%w by peer: %s", ErrRefused, h.reason)
	case h.ringCapacity != 0:
		return h, fmt.Errorf("%w: a reply with ring capacity %d", ErrProtocol, h.ringCapacity)
	case h.flags&cmFlagHeld != 0 && nfds != 0:
		return h, fmt.Errorf("%w: a reply flagged as held with %d fds", ErrProtocol, nfds)
	case h.flags&cmFlagHeld == 0 && nfds != cmReplyFds:
		return h, fmt.Errorf("%w: a reply with %d fds, want %d", ErrProtocol, nfds, cmReplyFds)
	}
	return h, nil
}

// cmMsg is a control message after the handshake.
type cmMsg struct {
	typ uint32 // cmSegAdd, cmSegDeny, cmSegDel
	idx uint32 // the sender's memory segment index
}

func (m cmMsg) marshal() [cmMsgSize]byte {
	var b [cmMsgSize]byte
	binary.LittleEndian.PutUint32(b[msgTypeOff:], m.typ)
	binary.LittleEndian.PutUint32(b[msgIndexOff:], m.idx)
	return b
}

// parseCMMsg decodes and validates a control message that came with nfds
// fds from a peer speaking version: SEG_ADD carries one fd, SEG_DENY and
// SEG_DEL (version 2 on) none.
func parseCMMsg(b []byte, nfds int, version uint16) (cmMsg, error) {
	if len(b) != cmMsgSize {
		return cmMsg{}, fmt.Errorf("%w: control message of %d bytes", ErrProtocol, len(b))
	}
	m := cmMsg{typ: binary.LittleEndian.Uint32(b[msgTypeOff:]), idx: binary.LittleEndian.Uint32(b[msgIndexOff:])}
	var want int
	switch {
	case m.typ == cmSegAdd:
		want = 1
	case m.typ == cmSegDeny, m.typ == cmSegDel && version >= 2:
		want = 0
	default:
		return m, fmt.Errorf("%w: control message of type %d", ErrProtocol, m.typ)
	}
	if nfds != want {
		return m, fmt.Errorf("%w: control message of type %d with %d fds", ErrProtocol, m.typ, nfds)
	}
	return m, nil
}
