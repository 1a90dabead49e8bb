package stats

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// fakeEndpoint listens on addr and answers every connection with msg and
// the fds of segs (and of raw, unsealed fds), as a hostile or broken
// process could.
func fakeEndpoint(t *testing.T, addr, msg string, segs []*shm.Segment, raw []int) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			fds := raw
			for _, s := range segs {
				fds = append(fds[:len(fds):len(fds)], s.Fd())
			}
			if len(fds) > 0 {
				sys.SendFds(c, []byte(msg), fds...)
			} else {
				c.Write([]byte(msg))
			}
			c.Close()
		}
	}()
}

// badTable returns a statistics segment whose table header is what edit
// makes of a valid one.
func badTable(t *testing.T, edit func(mem []byte)) *shm.Segment {
	t.Helper()
	tab, err := newTable(0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tab.close() })
	tab.write([]entry{{"g", "n", 1}}, time.Now(), time.Second, 0)
	edit(tab.mem)
	return tab.seg
}

func TestHostileEndpoint(t *testing.T) {
	self := os.Getpid()
	memfd := func(t *testing.T) []int {
		fd, err := sys.MemfdCreate("unsealed")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sys.Close(fd) })
		if err := sys.Ftruncate(fd, int64(2*sys.PageSize)); err != nil {
			t.Fatal(err)
		}
		return []int{fd}
	}
	cases := []struct {
		name    string
		msg     string
		segs    func(t *testing.T) []*shm.Segment
		raw     func(t *testing.T) []int
		openErr error // from Open, else from the first Snapshot
		snapErr error
	}{
		{name: "garbage message", msg: "hello there", openErr: ErrCorrupt},
		{name: "no fd", msg: helloOK, openErr: ErrCorrupt},
		{name: "unsealed memfd", msg: helloOK, raw: memfd, openErr: ErrCorrupt},
		{name: "wrong kind", msg: helloOK, openErr: ErrCorrupt, segs: func(t *testing.T) []*shm.Segment {
			s, err := shm.CreateSegment("x", shm.KindRings, 4096)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return []*shm.Segment{s}
		}},
		{name: "two fds", msg: helloOK, openErr: ErrCorrupt, segs: func(t *testing.T) []*shm.Segment {
			return []*shm.Segment{badTable(t, func([]byte) {}), badTable(t, func([]byte) {})}
		}},
		{name: "bad magic", msg: helloOK, snapErr: ErrCorrupt, segs: func(t *testing.T) []*shm.Segment {
			return []*shm.Segment{badTable(t, func(m []byte) { shm.StoreUint32(m, hMagicOff, 0) })}
		}},
		{name: "count above capacity", msg: helloOK, snapErr: ErrCorrupt, segs: func(t *testing.T) []*shm.Segment {
			return []*shm.Segment{badTable(t, func(m []byte) { shm.StoreUint32(m, hCountOff, 1<<30) })}
		}},
		{name: "stuck mid-update", msg: helloOK, snapErr: ErrBusy, segs: func(t *testing.T) []*shm.Segment {
			return []*shm.Segment{badTable(t, func(m []byte) { shm.StoreUint64(m, hSeqOff, 7) })}
		}},
		{name: "unknown state", msg: helloOK, snapErr: ErrCorrupt, segs: func(t *testing.T) []*shm.Segment {
			return []*shm.Segment{badTable(t, func(m []byte) { shm.StoreUint32(m, hStateOff, 9) })}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var segs []*shm.Segment
			var raw []int
			if c.segs != nil {
				segs = c.segs(t)
			}
			if c.raw != nil {
				raw = c.raw(t)
			}
			fakeEndpoint(t, Address(self), c.msg, segs, raw)
			r, err := Open(self)
			if c.openErr != nil {
				if !errors.Is(err, c.openErr) {
					t.Fatalf("Open: %v, want %v", err, c.openErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer r.Close()
			if _, err := r.Snapshot(); !errors.Is(err, c.snapErr) {
				t.Fatalf("Snapshot: %v, want %v", err, c.snapErr)
			}
		})
	}
}

// TestImpostor: a name is only trusted when the process behind it is the
// pid it names.
func TestImpostor(t *testing.T) {
	fakeEndpoint(t, Address(1), helloOK, []*shm.Segment{badTable(t, func([]byte) {})}, nil)
	if _, err := Open(1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open(1) of our socket: %v, want ErrCorrupt", err)
	}
}
