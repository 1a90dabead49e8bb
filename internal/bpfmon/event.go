package bpfmon

import (
	"encoding/binary"
	"fmt"
)

// Syscall names the system call that produced an Event. The values are the
// x86_64 system call numbers.
type Syscall uint16

// The system calls reported.
const (
	Mmap    Syscall = 9  // mmap with MAP_FIXED
	Munmap  Syscall = 11 // munmap
	Brk     Syscall = 12 // brk below the current break
	Mremap  Syscall = 25 // mremap: the old range, or (Dest) the MREMAP_FIXED destination
	Madvise Syscall = 28 // madvise with a discarding advice (Arg)
	Shmdt   Syscall = 67 // shmdt
)

func (s Syscall) String() string {
	switch s {
	case Mmap:
		return "mmap"
	case Munmap:
		return "munmap"
	case Brk:
		return "brk"
	case Mremap:
		return "mremap"
	case Madvise:
		return "madvise"
	case Shmdt:
		return "shmdt"
	}
	return fmt.Sprintf("syscall(%d)", uint16(s))
}

// Event is one range that a system call is about to unmap, replace or
// discard. A call that touches two ranges (mremap with MREMAP_FIXED) is two
// events, the old range first.
type Event struct {
	Syscall Syscall
	Start   uintptr // page-aligned as the call gave it
	Length  uintptr // rounded up to whole pages
	// Epoch is the value of the epoch word this event's increment produced.
	Epoch uint64
	Tid   uint32 // the calling thread, in the monitor's pid namespace
	// Arg is the madvise advice, or the mmap or mremap flags.
	Arg uint32
	// Dest is set on the event for mremap's MREMAP_FIXED destination.
	Dest bool
	// Unknown is set when the length was not known (shmdt before Linux
	// 5.17): the range runs to the top of the address space.
	Unknown bool
}

func (e Event) String() string {
	s := fmt.Sprintf("%s [%#x, +%#x) tid %d epoch %d", e.Syscall, e.Start, e.Length, e.Tid, e.Epoch)
	if e.Arg != 0 {
		s += fmt.Sprintf(" arg %#x", e.Arg)
	}
	if e.Dest {
		s += " dest"
	}
	if e.Unknown {
		s += " unknown-length"
	}
	return s
}

// The record the programs write (struct event in bpf/bpfmon.c), little
// endian:
//
//	0       8       16      24    28   30     32    36     40
//	+-------+-------+-------+-----+----+------+-----+------+
//	| start | len   | epoch | tid | nr | flags| arg | pad  |
//	+-------+-------+-------+-----+----+------+-----+------+
const (
	offStart  = 0
	offLen    = offStart + 8
	offEpoch  = offLen + 8
	offTid    = offEpoch + 8
	offNr     = offTid + 4
	offFlags  = offNr + 2
	offArg    = offFlags + 2
	offPad    = offArg + 4
	eventSize = offPad + 4

	flagDest    = 1 // EVF_DEST
	flagUnknown = 2 // EVF_UNKNOWN
)

// decodeEvent decodes a record; ok is false when it is not an event.
func decodeEvent(b []byte) (e Event, ok bool) {
	if len(b) != eventSize {
		return Event{}, false
	}
	flags := binary.LittleEndian.Uint16(b[offFlags:])
	return Event{
		Syscall: Syscall(binary.LittleEndian.Uint16(b[offNr:])),
		Start:   uintptr(binary.LittleEndian.Uint64(b[offStart:])),
		Length:  uintptr(binary.LittleEndian.Uint64(b[offLen:])),
		Epoch:   binary.LittleEndian.Uint64(b[offEpoch:]),
		Tid:     binary.LittleEndian.Uint32(b[offTid:]),
		Arg:     binary.LittleEndian.Uint32(b[offArg:]),
		Dest:    flags&flagDest != 0,
		Unknown: flags&flagUnknown != 0,
	}, true
}
