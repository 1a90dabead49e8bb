package main

// Control messages: sends on the queue pair, little-endian. Every message
// starts with a 4-byte magic naming its kind; anything from the peer is
// validated before use.
//
// params, the first send each way (48 + 4·nsizes bytes):
//
//	 0  magic u32 "SDPP"
//	 4  version u16 (1)
//	 6  test u8 (testKind)
//	 7  flags u8: bit 0 device memory (-d shm), bit 1 events (-e)
//	 8  iterations u64
//	16  buffer address u64   the buffer exposed for RDMA Write and Read
//	24  buffer rkey u64
//	32  buffer length u64
//	40  nsizes u32 (1 … maxSizes)
//	44  reserved u32 = 0
//	48  sizes u32[nsizes], each in [1, maxSize]
//
// row, client → server after every size (80 bytes):
//
//	 0  magic u32 "SDPR"
//	 4  kind u32: 1 latency, 2 bandwidth
//	 8  size u64
//	16  iterations u64
//	24  values f64[7]: latency t_min t_max t_typical t_avg t_stdev p99 p99.9;
//	    bandwidth peak average msgrate, then zeros
//
// ready, server → client once it is done with a size (16 bytes):
//
//	 0  magic u32 "SDPK"
//	 4  reserved u32 = 0
//	 8  size u64
//
// bye, client → server after the last ready (8 bytes):
//
//	 0  magic u32 "SDPB"
//	 4  reserved u32 = 0

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

const (
	magicParams = 0x50504453 // "SDPP"
	magicRow    = 0x52504453 // "SDPR"
	magicReady  = 0x4b504453 // "SDPK"
	magicBye    = 0x42504453 // "SDPB"

	protoVersion = 1

	paramsHeader = 48
	rowSize      = 80
	readySize    = 16
	byeSize      = 8

	flagShm    = 1 << 0
	flagEvents = 1 << 1

	rowLat = 1
	rowBW  = 2

	maxSize  = 1 << 23 // perftest's MAX_SIZE
	maxSizes = 23      // -a: 2^1 … 2^23
	maxIters = 1 << 24

	ctlMax = 256 // every control message fits; sends up to MaxInline need no lkey
)

var errBadMessage = errors.New("malformed control message")

// params is what each side tells the other at connect.
type params struct {
	test    testKind
	flags   uint8
	iters   uint64
	bufAddr uint64
	rkey    uint64
	bufLen  uint64
	sizes   []int
}

func (p *params) marshal() []byte {
	b := make([]byte, paramsHeader+4*len(p.sizes))
	binary.LittleEndian.PutUint32(b[0:], magicParams)
	binary.LittleEndian.PutUint16(b[4:], protoVersion)
	b[6] = uint8(p.test)
	b[7] = p.flags
	binary.LittleEndian.PutUint64(b[8:], p.iters)
	binary.LittleEndian.PutUint64(b[16:], p.bufAddr)
	binary.LittleEndian.PutUint64(b[24:], p.rkey)
	binary.LittleEndian.PutUint64(b[32:], p.bufLen)
	binary.LittleEndian.PutUint32(b[40:], uint32(len(p.sizes)))
	for i, s := range p.sizes {
		binary.LittleEndian.PutUint32(b[paramsHeader+4*i:], uint32(s))
	}
	return b
}

// parseParams decodes and validates the peer's params.
func parseParams(b []byte) (params, error) {
	var p params
	if len(b) < paramsHeader {
		return p, fmt.Errorf("%w: parameters of %d bytes", errBadMessage, len(b))
	}
	if m := binary.LittleEndian.Uint32(b); m != magicParams {
		return p, fmt.Errorf("%w: magic %#x where parameters were expected (not an sdperf peer?)", errBadMessage, m)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != protoVersion {
		return p, fmt.Errorf("%w: peer speaks sdperf protocol version %d, we speak %d", errBadMessage, v, protoVersion)
	}
	p.test = testKind(b[6])
	p.flags = b[7]
	p.iters = binary.LittleEndian.Uint64(b[8:])
	p.bufAddr = binary.LittleEndian.Uint64(b[16:])
	p.rkey = binary.LittleEndian.Uint64(b[24:])
	p.bufLen = binary.LittleEndian.Uint64(b[32:])
	n := binary.LittleEndian.Uint32(b[40:])
	switch {
	case p.test < sendLat || p.test > readBW:
		return p, fmt.Errorf("%w: test %d", errBadMessage, b[6])
	case p.flags&^(flagShm|flagEvents) != 0:
		return p, fmt.Errorf("%w: flags %#x", errBadMessage, p.flags)
	case p.iters < 1 || p.iters > maxIters:
		return p, fmt.Errorf("%w: %d iterations", errBadMessage, p.iters)
	case n < 1 || n > maxSizes || len(b) != paramsHeader+4*int(n):
		return p, fmt.Errorf("%w: %d sizes in %d bytes", errBadMessage, n, len(b))
	case binary.LittleEndian.Uint32(b[44:]) != 0:
		return p, fmt.Errorf("%w: reserved word set", errBadMessage)
	}
	p.sizes = make([]int, n)
	for i := range p.sizes {
		s := binary.LittleEndian.Uint32(b[paramsHeader+4*i:])
		if s < 1 || s > maxSize {
			return p, fmt.Errorf("%w: size %d", errBadMessage, s)
		}
		p.sizes[i] = int(s)
	}
	if p.bufLen < uint64(slices.Max(p.sizes)) || p.bufLen > 2*maxSize || p.bufAddr > math.MaxUint64-p.bufLen {
		return p, fmt.Errorf("%w: buffer of %d bytes at %#x", errBadMessage, p.bufLen, p.bufAddr)
	}
	return p, nil
}

// words renders the parameters that must match as the command line that
// would give them: "write_lat -s 2 -n 1000".
func (p *params) words() string {
	var b strings.Builder
	b.WriteString(p.test.String())
	switch {
	case slices.Equal(p.sizes, allSizes()):
		b.WriteString(" -a")
	case len(p.sizes) == 1:
		fmt.Fprintf(&b, " -s %d", p.sizes[0])
	default:
		fmt.Fprintf(&b, " sizes %v", p.sizes)
	}
	fmt.Fprintf(&b, " -n %d", p.iters)
	return b.String()
}

// sameRun tells whether two sides' parameters describe the same run.
func sameRun(a, b *params) bool {
	return a.test == b.test && a.iters == b.iters && slices.Equal(a.sizes, b.sizes)
}

func memoryName(flags uint8) string {
	if flags&flagShm != 0 {
		return "shm"
	}
	return "cma"
}

// row is one line of a result table.
type row struct {
	kind  uint32 // rowLat or rowBW
	size  int
	iters int
	v     [7]float64
}

func (r *row) marshal() []byte {
	b := make([]byte, rowSize)
	binary.LittleEndian.PutUint32(b[0:], magicRow)
	binary.LittleEndian.PutUint32(b[4:], r.kind)
	binary.LittleEndian.PutUint64(b[8:], uint64(r.size))
	binary.LittleEndian.PutUint64(b[16:], uint64(r.iters))
	for i, v := range r.v {
		binary.LittleEndian.PutUint64(b[24+8*i:], math.Float64bits(v))
	}
	return b
}

func parseRow(b []byte) (row, error) {
	var r row
	if len(b) != rowSize || binary.LittleEndian.Uint32(b) != magicRow {
		return r, fmt.Errorf("%w: %d bytes where a result row was expected", errBadMessage, len(b))
	}
	r.kind = binary.LittleEndian.Uint32(b[4:])
	size := binary.LittleEndian.Uint64(b[8:])
	iters := binary.LittleEndian.Uint64(b[16:])
	if r.kind != rowLat && r.kind != rowBW || size < 1 || size > maxSize || iters < 1 || iters > maxIters {
		return r, fmt.Errorf("%w: row kind %d, size %d, %d iterations", errBadMessage, r.kind, size, iters)
	}
	r.size, r.iters = int(size), int(iters)
	for i := range r.v {
		v := math.Float64frombits(binary.LittleEndian.Uint64(b[24+8*i:]))
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return r, fmt.Errorf("%w: row value %v", errBadMessage, v)
		}
		r.v[i] = v
	}
	return r, nil
}

func readyMsg(size int) []byte {
	b := make([]byte, readySize)
	binary.LittleEndian.PutUint32(b[0:], magicReady)
	binary.LittleEndian.PutUint64(b[8:], uint64(size))
	return b
}

func parseReady(b []byte, size int) error {
	if len(b) != readySize || binary.LittleEndian.Uint32(b) != magicReady || binary.LittleEndian.Uint32(b[4:]) != 0 {
		return fmt.Errorf("%w: %d bytes where the server's ready was expected", errBadMessage, len(b))
	}
	if s := binary.LittleEndian.Uint64(b[8:]); s != uint64(size) {
		return fmt.Errorf("%w: server ready for size %d, expected %d", errBadMessage, s, size)
	}
	return nil
}

func byeMsg() []byte {
	b := make([]byte, byeSize)
	binary.LittleEndian.PutUint32(b, magicBye)
	return b
}

func parseBye(b []byte) error {
	if len(b) != byeSize || binary.LittleEndian.Uint32(b) != magicBye || binary.LittleEndian.Uint32(b[4:]) != 0 {
		return fmt.Errorf("%w: %d bytes where the client's bye was expected", errBadMessage, len(b))
	}
	return nil
}
