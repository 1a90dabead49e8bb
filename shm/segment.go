package shm

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/sandirect/sandirect/internal/sys"
)

// Segment kinds: which layout follows the segment header. Higher layers
// define their own kinds at KindUser and above.
const (
	KindRings uint32 = 1 // one or more rings, the layout its user defines
	KindWake  uint32 = 2 // a wake hub's table (Hub)
	KindUser  uint32 = 0x100
)

// MaxSegmentSize bounds segments this package creates or accepts.
const MaxSegmentSize = 1 << 34

const requiredSeals = sys.SealShrink | sys.SealGrow | sys.SealSeal

// Segment is a shared-memory segment: a sealed memfd mapped MAP_SHARED.
// Its methods are safe for concurrent use; the memory it maps is shared with
// the peer and untrusted (see the package comment).
type Segment struct {
	fd    int // -1 once DropFd closed it
	mem   []byte
	kind  uint32
	seals int // as read when the segment was created or opened

	closeOnce sync.Once
	closeErr  error
}

// CreateSegment makes a new segment of size bytes (rounded up to whole
// pages, at least SegmentHeaderSize) of the given kind, sealed and
// pre-faulted, with its header written. name appears in /proc/PID/maps as
// "memfd:sandirect:NAME"; nothing is created in any file system.
func CreateSegment(name string, kind uint32, size int) (*Segment, error) {
	return createSegment(name, kind, size, 0, true)
}

// CreateSegmentLazy is CreateSegment without pre-faulting: a page takes
// memory when it is first touched, here or in a peer that maps the segment
// with OpenSegmentLazy. For memory that stays mostly untouched, such as a
// connection's rings: an idle connection touches a page or two of them.
func CreateSegmentLazy(name string, kind uint32, size int) (*Segment, error) {
	return createSegment(name, kind, size, 0, false)
}

// CreateReadOnlySegment is CreateSegment for memory peers must only read,
// like a registration table: it is writable through this side's mapping
// alone, and whoever receives its fd can map it for reading, never for
// writing (F_SEAL_FUTURE_WRITE, set before F_SEAL_SEAL; Linux 5.1).
func CreateReadOnlySegment(name string, kind uint32, size int) (*Segment, error) {
	return createSegment(name, kind, size, sys.SealFutureWrite, true)
}

func createSegment(name string, kind uint32, size int, extraSeals int, populate bool) (*Segment, error) {
	if size < SegmentHeaderSize || size > MaxSegmentSize {
		return nil, fmt.Errorf("shm: segment size %d outside [%d, %d]", size, SegmentHeaderSize, MaxSegmentSize)
	}
	size = (size + sys.PageSize - 1) &^ (sys.PageSize - 1)
	fd, err := sys.MemfdCreate("sandirect:" + name)
	if err != nil {
		return nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	if err := sys.Ftruncate(fd, int64(size)); err != nil {
		sys.Close(fd)
		return nil, fmt.Errorf("shm: size segment: %w", err)
	}
	// Mapped before it is sealed: F_SEAL_FUTURE_WRITE leaves this mapping,
	// and only this one, writable.
	mem, err := sys.MapShared(fd, size, populate)
	if err != nil {
		sys.Close(fd)
		return nil, fmt.Errorf("shm: map segment: %w", err)
	}
	if err := sys.AddSeals(fd, requiredSeals|extraSeals); err != nil {
		sys.Munmap(mem)
		sys.Close(fd)
		return nil, fmt.Errorf("shm: seal segment: %w", err)
	}
	binary.LittleEndian.PutUint64(mem[segMagicOff:], segMagic)
	binary.LittleEndian.PutUint32(mem[segVersionOff:], segVersion)
	binary.LittleEndian.PutUint32(mem[segKindOff:], kind)
	binary.LittleEndian.PutUint64(mem[segSizeOff:], uint64(size))
	binary.LittleEndian.PutUint32(mem[segPidOff:], uint32(os.Getpid()))
	return &Segment{fd: fd, mem: mem, kind: kind, seals: requiredSeals | extraSeals}, nil
}

// OpenSegment maps a segment received from a peer. It takes ownership of fd:
// on error fd is closed. It refuses, with an error matching ErrBadSegment,
// an fd that is not a sealed regular file (F_SEAL_SHRINK, F_SEAL_GROW and
// F_SEAL_SEAL must all be set), whose size is not a whole number of pages in
// [wantMin, MaxSegmentSize], or whose header does not match (magic, version,
// kind, size).
func OpenSegment(fd int, kind uint32, wantMin int) (*Segment, error) {
	return openSegmentFd(fd, kind, wantMin, true)
}

// OpenSegmentLazy is OpenSegment without pre-faulting (CreateSegmentLazy):
// a page takes memory when first touched, and a peer's segment costs us
// nothing for the pages we never touch.
func OpenSegmentLazy(fd int, kind uint32, wantMin int) (*Segment, error) {
	return openSegmentFd(fd, kind, wantMin, false)
}

func openSegmentFd(fd int, kind uint32, wantMin int, populate bool) (*Segment, error) {
	s, err := openSegment(fd, kind, wantMin, false, populate)
	if err != nil {
		sys.Close(fd)
		return nil, err
	}
	return s, nil
}

func openSegment(fd int, kind uint32, wantMin int, readOnly, populate bool) (*Segment, error) {
	seals, err := sys.GetSeals(fd)
	if err != nil {
		return nil, fmt.Errorf("%w: fd %d does not support seals (not a memfd?): %v", ErrBadSegment, fd, err)
	}
	if seals&requiredSeals != requiredSeals {
		return nil, fmt.Errorf("%w: seals %#x lack %#x: the peer could resize it under our mapping", ErrBadSegment, seals, requiredSeals&^seals)
	}
	st, err := sys.Fstat(fd)
	if err != nil {
		return nil, fmt.Errorf("shm: fstat segment: %w", err)
	}
	if !st.Regular {
		return nil, fmt.Errorf("%w: not a regular file", ErrBadSegment)
	}
	if wantMin < SegmentHeaderSize {
		wantMin = SegmentHeaderSize
	}
	if st.Size < int64(wantMin) || st.Size > MaxSegmentSize || st.Size%int64(sys.PageSize) != 0 {
		return nil, fmt.Errorf("%w: size %d, want a whole number of pages in [%d, %d]", ErrBadSegment, st.Size, wantMin, int64(MaxSegmentSize))
	}
	var mem []byte
	if readOnly {
		mem, err = sys.MapSharedReadOnly(fd, int(st.Size))
	} else {
		mem, err = sys.MapShared(fd, int(st.Size), populate)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: map segment: %w", err)
	}
	// Load each header word once, then validate the copies.
	magic := load64(word64(mem, segMagicOff))
	version := load32(word32(mem, segVersionOff))
	gotKind := load32(word32(mem, segKindOff))
	size := load64(word64(mem, segSizeOff))
	switch {
	case magic != segMagic:
		err = fmt.Errorf("%w: bad magic %#x", ErrBadSegment, magic)
	case version != segVersion:
		err = fmt.Errorf("%w: layout version %d, want %d", ErrBadSegment, version, segVersion)
	case gotKind != kind:
		err = fmt.Errorf("%w: kind %d, want %d", ErrBadSegment, gotKind, kind)
	case size != uint64(st.Size):
		err = fmt.Errorf("%w: header says %d bytes, file has %d", ErrBadSegment, size, st.Size)
	}
	if err != nil {
		sys.Munmap(mem)
		return nil, err
	}
	return &Segment{fd: fd, mem: mem, kind: kind, seals: seals}, nil
}

// FileID names the file behind a segment: two fds, in this process or
// received from different peers, that refer to one memfd have the same
// FileID, and no other file has it while either is open or mapped.
type FileID struct{ Dev, Ino uint64 }

// FileIDOf returns the identity of the file fd refers to.
func FileIDOf(fd int) (FileID, error) {
	st, err := sys.Fstat(fd)
	if err != nil {
		return FileID{}, fmt.Errorf("shm: fstat: %w", err)
	}
	return FileID{Dev: st.Dev, Ino: st.Ino}, nil
}

// DropFd closes the segment's fd and keeps the mapping, for a segment
// this side will never pass on: the mapping alone keeps the memory, and a
// process with many connections runs out of fds long before it runs out
// of mappings. Fd returns -1 afterwards; Close still unmaps.
// It must not run concurrently with Close or Fd.
func (s *Segment) DropFd() error {
	if s.fd < 0 {
		return nil
	}
	err := sys.Close(s.fd)
	s.fd = -1
	if err != nil {
		return fmt.Errorf("shm: close segment fd: %w", err)
	}
	return nil
}

// Bytes returns the whole mapping, header included.
func (s *Segment) Bytes() []byte { return s.mem }

// WritesSealed tells whether no new writable mapping of the segment can be
// made (CreateReadOnlySegment, or F_SEAL_WRITE). The seals are those read
// when the segment was opened: F_SEAL_SEAL, which every segment has, makes
// them final.
func (s *Segment) WritesSealed() bool {
	return s.seals&(sys.SealFutureWrite|sys.SealWrite) != 0
}

// Size returns the mapping's length in bytes.
func (s *Segment) Size() int { return len(s.mem) }

// Fd returns the memfd, or -1 after DropFd. It stays owned by the segment.
func (s *Segment) Fd() int { return s.fd }

// Kind returns the segment's layout kind.
func (s *Segment) Kind() uint32 { return s.kind }

// Region returns size bytes at off, or an error if they do not lie inside
// the segment after its header.
func (s *Segment) Region(off, size int) ([]byte, error) {
	if off < SegmentHeaderSize || size < 0 || off > len(s.mem) || size > len(s.mem)-off {
		return nil, fmt.Errorf("%w: region [%d, +%d) outside segment of %d bytes", ErrBadSegment, off, size, len(s.mem))
	}
	return s.mem[off : off+size : off+size], nil
}

// Close unmaps the segment and closes its fd. Slices obtained from it must
// not be used afterwards. Close is idempotent.
func (s *Segment) Close() error {
	s.closeOnce.Do(func() {
		err1 := sys.Munmap(s.mem)
		var err2 error
		if s.fd >= 0 {
			err2 = sys.Close(s.fd)
		}
		s.mem = nil
		if err1 != nil {
			s.closeErr = fmt.Errorf("shm: unmap segment: %w", err1)
		} else if err2 != nil {
			s.closeErr = fmt.Errorf("shm: close segment: %w", err2)
		}
	})
	return s.closeErr
}

// SendSegments sends msg together with the segments' fds over c
// (SCM_RIGHTS). The segments stay open on this side.
func SendSegments(c *net.UnixConn, msg []byte, segs ...*Segment) error {
	fds := make([]int, len(segs))
	for i, s := range segs {
		if s.fd < 0 {
			return fmt.Errorf("shm: send segments: segment %d has no fd (DropFd)", i)
		}
		fds[i] = s.fd
	}
	if err := sys.SendFds(c, msg, fds...); err != nil {
		return fmt.Errorf("shm: send segments: %w", err)
	}
	return nil
}

// ReceiveFds receives one message of at most len(buf) bytes carrying at most
// max fds from c. The caller owns the fds and passes each to OpenSegment,
// or closes it.
func ReceiveFds(c *net.UnixConn, buf []byte, max int) (int, []int, error) {
	n, fds, err := sys.RecvFds(c, buf, max)
	if err != nil {
		return 0, nil, fmt.Errorf("shm: receive segments: %w", err)
	}
	return n, fds, nil
}

// CloseFds closes fds received with ReceiveFds that will not be opened.
func CloseFds(fds []int) { sys.CloseAll(fds) }

// File returns a duplicate of the segment's fd as an *os.File, for handing
// to a child process (exec.Cmd.ExtraFiles). The caller closes it.
func (s *Segment) File() (*os.File, error) {
	if s.fd < 0 {
		return nil, fmt.Errorf("shm: segment has no fd (DropFd)")
	}
	fd, err := sys.Dup(s.fd)
	if err != nil {
		return nil, fmt.Errorf("shm: dup segment fd: %w", err)
	}
	return os.NewFile(uintptr(fd), "sandirect-segment"), nil
}

// OpenSegmentReadOnly is OpenSegment for a segment this process only reads
// (a table its owner writes): the mapping is PROT_READ, so not even a bug
// here can write into it.
func OpenSegmentReadOnly(fd int, kind uint32, wantMin int) (*Segment, error) {
	s, err := openSegment(fd, kind, wantMin, true, true)
	if err != nil {
		sys.Close(fd)
		return nil, err
	}
	return s, nil
}
