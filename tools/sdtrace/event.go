package main

import (
	"encoding/binary"
	"fmt"
)

// The record go_entry writes (struct event in bpf/sdtrace.c), little
// endian:
//
//	0     8        16   24    28        32                    104        120
//	+-----+--------+----+-----+---------+---------------------+----------+
//	| ts  | cookie | g  | tid | derefOK | regs[9]: RAX RBX RCX | deref[2] |
//	|     |        |    |     |         | RDI RSI R8 R9 R10 R11|          |
//	+-----+--------+----+-----+---------+---------------------+----------+
const (
	offTS      = 0
	offCookie  = offTS + 8
	offG       = offCookie + 8
	offTid     = offG + 8
	offDerefOK = offTid + 4
	offRegs    = offDerefOK + 4
	nRegs      = 9
	offDeref   = offRegs + 8*nRegs
	recordSize = offDeref + 16
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
	cookieDerefRBX  = 1 << 16 // copy the two words RBX points at
)

// record is one probe hit as the BPF program reports it.
type record struct {
	ts      uint64 // CLOCK_MONOTONIC nanoseconds
	probe   probeID
	g       uint64 // the goroutine (R14)
	tid     uint32
	derefOK bool
	regs    [nRegs]uint64
	deref   [2]uint64
}

func decodeRecord(b []byte) (record, error) {
	if len(b) != recordSize {
		return record{}, fmt.Errorf("sdtrace: ring record of %d bytes, want %d", len(b), recordSize)
	}
	le := binary.LittleEndian
	r := record{
		ts:      le.Uint64(b[offTS:]),
		probe:   probeID(le.Uint64(b[offCookie:]) & cookieProbeMask),
		g:       le.Uint64(b[offG:]),
		tid:     le.Uint32(b[offTid:]),
		derefOK: le.Uint32(b[offDerefOK:]) != 0,
	}
	for i := range r.regs {
		r.regs[i] = le.Uint64(b[offRegs+8*i:])
	}
	r.deref[0] = le.Uint64(b[offDeref:])
	r.deref[1] = le.Uint64(b[offDeref+8:])
	return r, nil
}
