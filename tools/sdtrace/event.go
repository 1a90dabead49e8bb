package main

import (
	"encoding/binary"
	"fmt"
)

// The record go_entry writes (struct event in bpf/sdtrace.c), little
// endian. The program can also copy the 64 bytes RBX points at (deref),
// for a probe whose argument is a pointer; every probe here takes plain
// integers, so none asks for it, and the bytes are skipped.
//
//	0     8        16   24    28       32                     104          168          232
//	+-----+--------+----+-----+--------+----------------------+------------+------------+
//	| ts  | cookie | g  | tid | copied | regs[9]: RAX RBX RCX | deref[64]: | stack[64]: |
//	|     |        |    |     |        | RDI RSI R8 R9 R10 R11| *RBX       | SP+8       |
//	+-----+--------+----+-----+--------+----------------------+------------+------------+
const (
	offTS      = 0
	offCookie  = offTS + 8
	offG       = offCookie + 8
	offTid     = offG + 8
	offCopied  = offTid + 4
	offRegs    = offCopied + 4
	nRegs      = 9
	offDeref   = offRegs + 8*nRegs
	copyBytes  = 64
	offStack   = offDeref + copyBytes
	recordSize = offStack + copyBytes

	copiedStack = 2 // COPIED_STACK: stack holds the stack arguments
)

// The argument registers of Go's register ABI on amd64, in order.
const (
	rAX = iota
	rBX
	rCX
	rDI
	rSI
	r8
	r9
	r10
	r11
)

// The cookie of an attachment: the probe in the low 16 bits, and flags.
const (
	cookieProbeMask = 0xffff
	cookieStack     = 1 << 17 // copy the 64 bytes of stack arguments
)

// record is one probe hit as the BPF program reports it.
type record struct {
	ts      uint64 // CLOCK_MONOTONIC nanoseconds
	probe   probeID
	g       uint64 // the goroutine (R14)
	tid     uint32
	stackOK bool // stack holds the stack arguments
	regs    [nRegs]uint64
	stack   [copyBytes]byte
}

// word returns the 8 bytes at off of b (the stack words), little endian.
func word(b *[copyBytes]byte, off uintptr) uint64 {
	if off+8 > copyBytes {
		return 0
	}
	return binary.LittleEndian.Uint64(b[off:])
}

func decodeRecord(b []byte) (record, error) {
	if len(b) != recordSize {
		return record{}, fmt.Errorf("sdtrace: ring record of %d bytes, want %d", len(b), recordSize)
	}
	le := binary.LittleEndian
	r := record{
		ts:    le.Uint64(b[offTS:]),
		probe: probeID(le.Uint64(b[offCookie:]) & cookieProbeMask),
		g:     le.Uint64(b[offG:]),
		tid:   le.Uint32(b[offTid:]),
	}
	copied := le.Uint32(b[offCopied:])
	r.stackOK = copied&copiedStack != 0
	for i := range r.regs {
		r.regs[i] = le.Uint64(b[offRegs+8*i:])
	}
	copy(r.stack[:], b[offStack:])
	return r, nil
}
