package shm

import (
	"sync/atomic"
	"unsafe"
)

// The only place where this package touches shared words. Every access to a
// word that another process may read or write concurrently goes through one
// of these, and says at its call site what it publishes or observes. Go's
// sync/atomic operations are sequentially consistent, which the doorbell's
// announce-then-recheck protocol relies on.

// word64 returns a pointer to the 8-byte aligned word at off in mem. The
// caller has checked off+8 <= len(mem) and off%8 == 0.
func word64(mem []byte, off int) *uint64 {
	return (*uint64)(unsafe.Pointer(unsafe.SliceData(mem[off : off+8])))
}

// word32 returns a pointer to the 4-byte aligned word at off in mem.
func word32(mem []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(unsafe.SliceData(mem[off : off+4])))
}

func load64(p *uint64) uint64     { return atomic.LoadUint64(p) }
func store64(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
func load32(p *uint32) uint32     { return atomic.LoadUint32(p) }
func store32(p *uint32, v uint32) { atomic.StoreUint32(p, v) }
func swap32(p *uint32, v uint32) uint32 {
	return atomic.SwapUint32(p, v)
}
func swap64(p *uint64, v uint64) uint64 { return atomic.SwapUint64(p, v) }
func or64(p *uint64, v uint64)          { atomic.OrUint64(p, v) }

// at returns a pointer to the 8-byte word at offset off from base. The
// caller guarantees off+8 does not pass the end of the area base points to
// (offsets are masked positions, 8-byte aligned, below the capacity).
func at(base unsafe.Pointer, off uint64) *uint64 {
	return (*uint64)(unsafe.Add(base, off))
}

// Exported accessors for the shared tables of higher layers. Each loads or
// stores one word with sequentially consistent ordering; off must be
// aligned to the word and lie inside mem (else they panic: a programming
// error, since offsets come from layout constants and validated indices).

// LoadUint64 loads the 8-byte word at off in mem.
func LoadUint64(mem []byte, off int) uint64 { return load64(word64(mem, checkAlign(off, 8))) }

// StoreUint64 stores v in the 8-byte word at off in mem.
func StoreUint64(mem []byte, off int, v uint64) { store64(word64(mem, checkAlign(off, 8)), v) }

// LoadUint32 loads the 4-byte word at off in mem.
func LoadUint32(mem []byte, off int) uint32 { return load32(word32(mem, checkAlign(off, 4))) }

// StoreUint32 stores v in the 4-byte word at off in mem.
func StoreUint32(mem []byte, off int, v uint32) { store32(word32(mem, checkAlign(off, 4)), v) }

func checkAlign(off, size int) int {
	if off%size != 0 {
		panic("shm: misaligned shared word")
	}
	return off
}
