package shm

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

func newSegment(t *testing.T, size int) *Segment {
	t.Helper()
	s, err := CreateSegment(t.Name(), KindRings, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestCreateSegment(t *testing.T) {
	s := newSegment(t, 5000)
	if s.Size() != 8192 {
		t.Fatalf("size %d, want rounding up to 8192", s.Size())
	}
	seals, err := sys.GetSeals(s.Fd())
	if err != nil || seals&requiredSeals != requiredSeals {
		t.Fatalf("seals %#x, %v: want %#x", seals, err, requiredSeals)
	}
	if err := sys.Ftruncate(s.Fd(), 1<<20); err == nil {
		t.Fatal("growing a sealed segment succeeded")
	}
	if err := sys.Ftruncate(s.Fd(), 4096); err == nil {
		t.Fatal("shrinking a sealed segment succeeded")
	}
	maps, _ := os.ReadFile("/proc/self/maps")
	if !strings.Contains(string(maps), "memfd:sandirect:"+t.Name()) {
		t.Fatal("segment not found in /proc/self/maps")
	}
	for _, bad := range []int{0, SegmentHeaderSize - 1, MaxSegmentSize + 1} {
		if s, err := CreateSegment("bad", KindRings, bad); err == nil {
			s.Close()
			t.Errorf("CreateSegment(%d) succeeded", bad)
		}
	}
}

func dupFd(t *testing.T, fd int) int {
	t.Helper()
	d, err := sys.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestOpenSegmentRefuses(t *testing.T) {
	good := newSegment(t, 4096)
	unsealed := func() int {
		fd, err := sys.MemfdCreate("unsealed")
		if err != nil {
			t.Fatal(err)
		}
		sys.Ftruncate(fd, 4096)
		return fd
	}
	partlySealed := func() int {
		fd := unsealed()
		sys.AddSeals(fd, sys.SealShrink)
		return fd
	}
	pipe := func() int {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		return dupFd(t, int(r.Fd()))
	}
	regular := func() int {
		f, err := os.CreateTemp(t.TempDir(), "seg")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		f.Truncate(4096)
		return dupFd(t, int(f.Fd()))
	}
	badHeader := func(off int, val uint64) func() int {
		return func() int {
			s, err := CreateSegment("bad", KindRings, 4096)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			*word64(s.Bytes(), off) = val
			return dupFd(t, s.Fd())
		}
	}
	cases := []struct {
		name string
		fd   func() int
		kind uint32
		min  int
	}{
		{"unsealed memfd", unsealed, KindRings, 0},
		{"shrink seal only", partlySealed, KindRings, 0},
		{"pipe", pipe, KindRings, 0},
		{"regular file", regular, KindRings, 0},
		{"too short", func() int { return dupFd(t, good.Fd()) }, KindRings, 8192},
		{"wrong kind", func() int { return dupFd(t, good.Fd()) }, KindUser, 0},
		{"bad magic", badHeader(segMagicOff, 42), KindRings, 0},
		{"bad size", badHeader(segSizeOff, 1<<40), KindRings, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := OpenSegment(c.fd(), c.kind, c.min)
			if err == nil {
				s.Close()
				t.Fatal("opened")
			}
			if !errors.Is(err, ErrBadSegment) {
				t.Fatalf("error %v does not match ErrBadSegment", err)
			}
		})
	}
	// OpenSegment closed every refused fd: the leak check in TestMain
	// fails the run otherwise. The good one opens.
	s, err := OpenSegment(dupFd(t, good.Fd()), KindRings, 4096)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func unixPair(t *testing.T) (*net.UnixConn, *os.File) {
	t.Helper()
	a, b, err := sys.UnixPair()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.FileConn(a)
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); b.Close() })
	return c.(*net.UnixConn), b
}

func init() {
	// segreceiver receives a segment over SCM_RIGHTS on fd 3, opens it,
	// writes the message it came with into the segment, and exits.
	testutil.RegisterChild("segreceiver", func([]string) error {
		f := os.NewFile(3, "conn")
		c, err := net.FileConn(f)
		if err != nil {
			return err
		}
		buf := make([]byte, 64)
		n, fds, err := ReceiveFds(c.(*net.UnixConn), buf, 4)
		if err != nil {
			return err
		}
		if len(fds) != 1 {
			CloseFds(fds)
			return errors.New("want one fd")
		}
		s, err := OpenSegment(fds[0], KindRings, 0)
		if err != nil {
			return err
		}
		defer s.Close()
		copy(s.Bytes()[SegmentHeaderSize:], buf[:n])
		_, err = c.Write([]byte{1})
		return err
	})
}

func TestSegmentAcrossProcesses(t *testing.T) {
	s := newSegment(t, 4096)
	conn, peer := unixPair(t)
	child := testutil.StartChild(t, "segreceiver", []*os.File{peer})
	if err := SendSegments(conn, []byte("hello over SCM_RIGHTS"), s); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		t.Fatalf("no answer from child: %v\n%s", err, child.Output())
	}
	if err := child.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := string(s.Bytes()[SegmentHeaderSize : SegmentHeaderSize+21])
	if got != "hello over SCM_RIGHTS" {
		t.Fatalf("segment holds %q", got)
	}
}

// TestLazySegments: a lazy segment, created or opened, takes memory only
// for the pages touched (its header's); CreateSegment and OpenSegment
// fault every page in.
func TestLazySegments(t *testing.T) {
	const size = 1 << 20
	page := sys.PageSize / 1024
	lazy, err := CreateSegmentLazy(t.Name(), KindRings, size)
	if err != nil {
		t.Fatal(err)
	}
	defer lazy.Close()
	if got := resident(t, lazy.Bytes()); got > page {
		t.Errorf("lazy segment of %d KiB: %d KiB resident, want the header's page", size/1024, got)
	}
	fd, err := sys.Dup(lazy.Fd())
	if err != nil {
		t.Fatal(err)
	}
	opened, err := OpenSegmentLazy(fd, KindRings, size)
	if err != nil {
		t.Fatal(err)
	}
	defer opened.Close()
	if got := resident(t, opened.Bytes()); got > page {
		t.Errorf("lazily opened segment of %d KiB: %d KiB resident, want the header's page", size/1024, got)
	}
	opened.Bytes()[size-1] = 1 // one more page
	if got := resident(t, opened.Bytes()); got > 2*page {
		t.Errorf("after one write: %d KiB resident, want two pages", got)
	}
	full := newSegment(t, size)
	if got := resident(t, full.Bytes()); got != size/1024 {
		t.Errorf("CreateSegment of %d KiB: %d KiB resident, want all of it", size/1024, got)
	}
}

func resident(t *testing.T, mem []byte) int {
	t.Helper()
	n, err := testutil.ResidentKiB(mem)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
