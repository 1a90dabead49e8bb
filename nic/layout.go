package nic

import "github.com/sandirect/sandirect/shm"

// Shared layouts of this package. docs/nic.md repeats these diagrams;
// layout_test.go checks the constants.

// Segment kinds.
const (
	kindRegTable = shm.KindUser + 1
	kindQP       = shm.KindUser + 2
	kindMemory   = shm.KindUser + 3
)

// Registration table segment: written by its owner (the target), mapped
// read-only by every peer (the initiators).
//
//	offset 0    segment header (shm)
//	     128    table header: magic u32 "MRTB" | version u32 | entries u32 | entry size u32
//	     256    entries[entries], 64 bytes each
//
// Entry:
//
//	 0  seq u64      even: stable; odd: being rewritten. Only grows: it is
//	                 the entry's generation, bumped twice per change
//	 8  rkey u64     0: not exposed to peers
//	16  addr u64     start of the region in the owner's address space
//	24  length u64
//	32  access u32   AccessRemoteRead | AccessRemoteWrite (peers check these)
//	36  seg u32      owner's memory segment index, or noSegment: reach the
//	                 region with process_vm_readv/writev instead
//	40  segoff u64   offset of addr inside that segment
//	48  reserved, zero, to 64
//
// A reader loads seq, the fields, then seq again, and uses the fields only
// if both loads are equal and even.
const (
	regHeaderOff    = shm.SegmentHeaderSize
	regMagicOff     = regHeaderOff
	regVersionOff   = regMagicOff + 4
	regEntriesOff   = regVersionOff + 4
	regEntrySizeOff = regEntriesOff + 4
	regEntriesStart = regHeaderOff + 128

	entSeqOff    = 0
	entRKeyOff   = entSeqOff + 8
	entAddrOff   = entRKeyOff + 8
	entLenOff    = entAddrOff + 8
	entAccessOff = entLenOff + 8
	entSegOff    = entAccessOff + 4
	entSegOffOff = entSegOff + 4
	entEnd       = entSegOffOff + 8
	entrySize    = 64

	regMagic   = 0x4254524d // "MRTB"
	regVersion = 1

	noSegment = ^uint32(0)

	// rkeys carry the entry index in their low bits and random bits above.
	rkeyIndexBits = 24
	maxRegEntries = 1 << rkeyIndexBits
)

func regTableSize(entries int) int { return regEntriesStart + entries*entrySize }

// Queue pair segment: created by the dialer, holds both directions.
//
//	offset 0          segment header (shm)
//	     128          qp header: magic u32 "QPSG" | version u32 | ring capacity u32
//	                  | free u32 (qppool.go: 1 once the acceptor let go of it)
//	     256          ring dialer → listener (shm ring layout)
//	     256+R        ring listener → dialer, R = shm.RingSize(capacity)
const (
	qpHeaderOff   = shm.SegmentHeaderSize
	qpMagicOff    = qpHeaderOff
	qpVersionOff  = qpMagicOff + 4
	qpCapacityOff = qpVersionOff + 4
	qpFreeOff     = qpCapacityOff + 4
	qpRingsOff    = qpHeaderOff + 128

	qpMagic   = 0x47535051 // "QPSG"
	qpVersion = 1
)

func qpSegmentSize(capacity int) int { return qpRingsOff + 2*shm.RingSize(capacity) }

// Memory segment: device memory from Device.Alloc that peers map, so
// one-sided operations on it are plain copies.
//
//	offset 0      segment header (shm)
//	    4096      the buffer, page aligned
const memDataOff = 4096

// Ring record tags on a queue pair's rings.
const (
	tagSend uint16 = 1 // payload: the message
	tagNop  uint16 = 2 // payload: empty; skipped (a send whose source faulted)
)
