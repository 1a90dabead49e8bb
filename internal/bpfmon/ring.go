package bpfmon

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/sandirect/sandirect/internal/sys"
)

// A BPF ring buffer (kernel/bpf/ringbuf.c) as its consumer maps it:
//
//	fd offset 0          consumer page, read-write: consumer_pos (8 bytes)
//	fd offset page       producer page, read-only:  producer_pos (8 bytes)
//	fd offset 2*page     data, size bytes, mapped twice in a row so that a
//	                     record that wraps reads as one contiguous slice
//
// Positions only grow; masked by size-1 they index the data. Each record is
// an 8-byte header (length with the BUSY and DISCARD bits, then the kernel's
// page offset) and the sample, padded to 8 bytes. The producer sets BUSY at
// reserve and clears it at submit with a release store; we load the header
// with an atomic (acquire) load before reading the sample, and publish our
// position with an atomic store after we are done with the sample.
const (
	ringBusyBit    = 1 << 31 // BPF_RINGBUF_BUSY_BIT
	ringDiscardBit = 1 << 30 // BPF_RINGBUF_DISCARD_BIT
	ringHdrSize    = 8       // BPF_RINGBUF_HDR_SZ
)

// ring is the consumer side of the events ring buffer. read and readUntil
// must be called with Monitor.drainMu held; the rest are lock-free.
type ring struct {
	cons    []byte  // consumer page
	prod    []byte  // producer page and the data mapped twice
	consPos *uint64 // in cons; written only by us
	prodPos *uint64 // in prod; written by the kernel
	data    []byte  // prod[page:], 2*size bytes
	mask    uint64
}

func newRing(fd, size int) (*ring, error) {
	page := os.Getpagesize()
	if size <= 0 || size&(size-1) != 0 || size%page != 0 {
		return nil, fmt.Errorf("bpfmon: ring size %d not a power-of-two multiple of the page size", size)
	}
	cons, err := sys.MapFd(fd, 0, page, true)
	if err != nil {
		return nil, fmt.Errorf("bpfmon: map ring buffer consumer page: %w", err)
	}
	prod, err := sys.MapFd(fd, int64(page), page+2*size, false)
	if err != nil {
		sys.Munmap(cons)
		return nil, fmt.Errorf("bpfmon: map ring buffer data: %w", err)
	}
	r := &ring{cons: cons, prod: prod, data: prod[page:], mask: uint64(size - 1)}
	if r.consPos, err = sys.Word64(cons, 0); err == nil {
		r.prodPos, err = sys.Word64(prod, 0)
	}
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ring) close() {
	sys.Munmap(r.prod)
	sys.Munmap(r.cons)
	r.cons, r.prod, r.data = nil, nil, nil
}

// pending tells whether records (submitted or not) wait to be read.
func (r *ring) pending() bool {
	return atomic.LoadUint64(r.prodPos) != atomic.LoadUint64(r.consPos)
}

// producer returns the producer position.
func (r *ring) producer() uint64 { return atomic.LoadUint64(r.prodPos) }

// errBusy reports a record that is reserved but not yet submitted.
var errBusy = errors.New("bpfmon: record not submitted yet")

// read consumes the records up to the producer position, handing each event
// to fn, and stops early at a record that is not yet submitted (errBusy).
// It returns how many events it handed over. The data is written by the
// kernel, but a length that does not fit is still refused, never followed.
func (r *ring) read(fn func(Event)) (n int, err error) {
	prod := atomic.LoadUint64(r.prodPos)
	pos := atomic.LoadUint64(r.consPos)
	for pos < prod {
		off := pos & r.mask
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[off])))
		if hdr&ringBusyBit != 0 {
			return n, errBusy
		}
		size := uint64(hdr &^ (ringBusyBit | ringDiscardBit))
		total := (ringHdrSize + size + 7) &^ 7
		if size > r.mask || total > prod-pos {
			return n, fmt.Errorf("%w: %d bytes at position %d, %d produced", ErrCorrupt, size, pos, prod-pos)
		}
		if hdr&ringDiscardBit == 0 {
			ev, ok := decodeEvent(r.data[off+ringHdrSize : off+ringHdrSize+size])
			if !ok {
				atomic.StoreUint64(r.consPos, pos+total)
				return n, fmt.Errorf("%w: %d-byte sample", ErrCorrupt, size)
			}
			fn(ev)
			n++
		}
		pos += total
		atomic.StoreUint64(r.consPos, pos)
	}
	return n, nil
}

// readUntil consumes records until the consumer position reaches target,
// waiting on records that are reserved but not yet submitted: spinning, then
// yielding (a producer between reserve and submit runs a handful of
// instructions, but may be preempted).
func (r *ring) readUntil(target uint64, fn func(Event)) (n int, err error) {
	for spins := 0; ; spins++ {
		k, err := r.read(fn)
		n += k
		if err != errBusy {
			return n, err
		}
		if atomic.LoadUint64(r.consPos) >= target {
			return n, nil
		}
		if spins > 64 {
			runtime.Gosched()
		}
	}
}
