package sockets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// Application memory that vanishes (issue 21): a page of the buffer of a
// Write or a Read is unmapped before the call, or while it runs (at a
// step of the protocol, hooks.go), on every path that copies it: eager
// messages, the inline part of an rts, pieces copied into temporary
// memory (through the caches and around them), zero-copy sources that
// the peer reads or that we RDMA-Write, staging copy-outs, direct reads
// and sinks, and both halves of a split transfer; in both RDMA-Read
// modes, with every source mode; in one process and with the faulting
// side in a child process. The faulting call fails with an EFAULT-
// matching *net.OpError that names the application's buffer, after the
// bytes it accepted or delivered, which are counted exactly (the stream
// that arrives is checked byte by byte); then the connection either
// carries on or is aborted with that reason (doc.go says which), the
// peer's error never matches EFAULT, the process and its other
// connections carry on, and nothing leaks.

// faultCase is one buffer that faults.
type faultCase struct {
	name   string
	read   bool   // the Read's buffer faults (else the Write's)
	w, r   Config // the writer's and the reader's configurations
	at     step   // where the faulting side unmaps; stepNone: before the call
	size   int    // bytes of the faulting call: the Write, or the Read buffer
	chunk  int    // faulting reader: bytes per Read (0: the rest of the buffer)
	hole   int    // the page holding this byte of the buffer is unmapped
	lead   int    // the buffer starts lead bytes before a page boundary
	usable bool   // the connection carries on after the fault
	alloc  bool   // the writer's buffer is from AllocBuffer
	nt     bool   // pieces are copied around the caches
	split  bool   // split transfers on any memory; the buffers are used twice
}

// faultCases builds the table.
func faultCases() []faultCase {
	var cs []faultCase
	inline := smallConfig().BufferSize - headerSize
	for _, noRead := range []bool{false, true} {
		mode := "read"
		if noRead {
			mode = "write"
		}
		cfgs := func(zc ZeroCopy) (Config, Config) {
			w, r := smallConfig(), smallConfig()
			w.ZeroCopy = zc
			r.NoRDMARead = noRead
			return w, r
		}
		add := func(name string, zc ZeroCopy, c faultCase) {
			c.name = mode + "/" + name
			c.w, c.r = cfgs(zc)
			cs = append(cs, c)
		}
		// The writer's buffer.
		add("write/eager", ZeroCopyAuto, faultCase{size: 2000, lead: 1000, hole: 1500, usable: true})
		add("write/alloc-eager", ZeroCopyAuto, faultCase{size: 2000, hole: 1500, usable: true, alloc: true})
		for _, zc := range []ZeroCopy{ZeroCopyAuto, ZeroCopyAlways, ZeroCopyNever} {
			// A copied piece faults (a source that cannot be pinned is
			// copied: always and auto fall back to the copy).
			add("write/piece-"+zc.String(), zc, faultCase{size: 200 << 10, hole: 150 << 10, usable: true})
			add("write/inline-"+zc.String(), zc, faultCase{size: 100 << 10, lead: inline, hole: 0, usable: true})
		}
		add("write/piece-nt", ZeroCopyNever, faultCase{size: 200 << 10, hole: 150 << 10, usable: true, nt: true})
		add("write/alloc-inline", ZeroCopyAuto, faultCase{size: 100 << 10, lead: inline, hole: 0, usable: true, alloc: true})
		under := stepSourceReady // the peer reads the source next
		if noRead {
			under = stepBeforeWrite // we RDMA-Write it next
		}
		add("write/zerocopy-under", ZeroCopyAlways, faultCase{size: 100 << 10, hole: 60 << 10, at: under})
		// The reader's buffer.
		for _, zc := range []ZeroCopy{ZeroCopyAlways, ZeroCopyNever} {
			add("read/eager-"+zc.String(), zc, faultCase{read: true, size: 2000, lead: 1000, hole: 1500, usable: true})
			add("read/staged-"+zc.String(), zc, faultCase{read: true, size: 100 << 10, chunk: 4 << 10, hole: 60 << 10, usable: true})
			// A sink that cannot be pinned: staged instead, then the
			// copy-out faults.
			add("read/direct-"+zc.String(), zc, faultCase{read: true, size: 100 << 10, hole: 60 << 10, usable: true})
			add("read/direct-under-"+zc.String(), zc, faultCase{read: true, size: 100 << 10, hole: 60 << 10, at: stepSinkReady})
		}
	}
	// Split transfers (the read rendezvous): the head that the reader
	// RDMA-Reads, the tail that the writer RDMA-Writes.
	split := func(name string, c faultCase) {
		c.name = "read/" + name
		c.w, c.r = smallConfig(), smallConfig()
		c.w.SplitMin, c.r.SplitMin = 16<<10, 16<<10
		c.w.ZeroCopyMax = 0 // no copy band: a reused source is zero-copy
		c.split = true
		cs = append(cs, c)
	}
	split("write/split-tail-under", faultCase{size: 100 << 10, hole: 90 << 10, at: stepBeforeTail})
	split("read/split-head-under", faultCase{read: true, size: 100 << 10, hole: 10 << 10, at: stepSinkReady})
	split("read/split-tail-under", faultCase{read: true, size: 100 << 10, hole: 90 << 10, at: stepSinkReady})
	return cs
}

// streamByte is the stream's byte at offset i: either side can check it.
func streamByte(i int) byte { return byte(uint32(i) * 2654435761 >> 24) }

func fillStream(b []byte, off int) {
	for i := range b {
		b[i] = streamByte(off + i)
	}
}

// checkPattern tells where b, the stream from offset off, differs.
func checkStream(b []byte, off, period int) error {
	for i := range b {
		if b[i] != streamByte((off+i)%period) {
			return fmt.Errorf("stream byte %d is %#x, want %#x", off+i, b[i], streamByte((off+i)%period))
		}
	}
	return nil
}

// faultBuffer is the faulting side's buffer, with the page to unmap.
type faultBuffer struct {
	buf      []byte
	unmap    func()
	holeFrom int // the first byte of the buffer in the unmapped page (may be < 0)
	release  func()
	err      error // of unmap
}

// unmapHole unmaps the page at addr, then maps it inaccessible: the next
// mapping of this process could land in the hole otherwise (one did), and
// the copy would not fault. The munmap is a real one, that the
// registration cache's monitor sees.
func unmapHole(addr uintptr, page int) error {
	if err := sys.MunmapRange(addr, uintptr(page)); err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	const mapFixedNoreplace = 0x100000
	r, _, e := syscall.Syscall6(syscall.SYS_MMAP, addr, uintptr(page), syscall.PROT_NONE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|mapFixedNoreplace, ^uintptr(0), 0)
	if e != 0 || r != addr {
		return fmt.Errorf("the unmapped page at %#x was mapped again at once: %v", addr, e)
	}
	return nil
}

// newFaultBuffer maps tc's buffer (from AllocBuffer on c with alloc),
// filled with the stream when it is the writer's.
func newFaultBuffer(c net.Conn, tc *faultCase) (*faultBuffer, error) {
	page := sys.PageSize
	lead := tc.lead
	if lead > 0 {
		lead = page - lead // offset in the region
	}
	// A mapped page before the hole: a new mapping could fill a hole at
	// the edge of the region.
	lead += page
	n := (lead + tc.size + page - 1) &^ (page - 1)
	var region []byte
	var release func()
	if tc.alloc {
		b, err := AllocBuffer(c, n)
		if err != nil {
			return nil, err
		}
		region, release = b, func() { FreeBuffer(b) }
	} else {
		b, err := sys.MapAnon(n)
		if err != nil {
			return nil, err
		}
		region, release = b, func() { sys.MunmapRange(sys.Addr(b), uintptr(len(b))) }
	}
	fb := &faultBuffer{buf: region[lead : lead+tc.size], release: release}
	if !tc.read {
		fillStream(fb.buf, 0)
	}
	holePage := (lead + tc.hole) &^ (page - 1)
	fb.holeFrom = holePage - lead
	var once sync.Once
	fb.unmap = func() { once.Do(func() { fb.err = unmapHole(sys.Addr(region)+uintptr(holePage), page) }) }
	return fb, nil
}

// forceNT makes c's device copy pieces around the caches (pieceCopier):
// both ways measured just now, the non-temporal one faster.
func forceNT(c net.Conn) {
	p := &c.(*Conn).dev.pieces
	p.mu.Lock()
	now := time.Now()
	p.tried = [2]time.Time{now, now}
	p.rate = [2]float64{1, 2}
	p.trial = 0
	p.mu.Unlock()
}

// isFault checks that err is the faulting call's error: an EFAULT-
// matching *net.OpError of op naming the application's buffer.
func isFault(err error, op string) error {
	var oe *net.OpError
	switch {
	case err == nil:
		return fmt.Errorf("%s: no error, want EFAULT", op)
	case !errors.Is(err, syscall.EFAULT) || !errors.As(err, &oe) || oe.Op != op:
		return fmt.Errorf("%s: %v (%T), want an EFAULT *net.OpError", op, err, err)
	case !strings.Contains(err.Error(), "application's "+op+" buffer faulted"):
		return fmt.Errorf("%s: %q does not name the application's buffer", op, err)
	}
	return nil
}

// faultingSide runs the side of tc whose buffer faults, on c: the call
// that faults, the checks of what it returned, and then either the rest
// of the stream (usable) or the connection's error (aborted).
func faultingSide(c net.Conn, tc *faultCase, setHole func(func())) error {
	fb, err := newFaultBuffer(c, tc)
	if err != nil {
		return err
	}
	defer fb.release()
	if tc.nt {
		forceNT(c)
	}
	if tc.read {
		return faultingReader(c, tc, fb, setHole)
	}
	return faultingWriter(c, tc, fb, setHole)
}

func faultingWriter(c net.Conn, tc *faultCase, fb *faultBuffer, setHole func(func())) error {
	if tc.split {
		// A buffer written from before: offered split.
		if _, err := c.Write(fb.buf); err != nil {
			return fmt.Errorf("first write: %w", err)
		}
	}
	if tc.at == stepNone {
		fb.unmap()
	} else {
		setHole(fb.unmap)
	}
	n, err := c.Write(fb.buf)
	if fb.err != nil {
		return fb.err
	}
	if ferr := isFault(err, "write"); ferr != nil {
		return ferr
	}
	if n < 0 || n > max(fb.holeFrom, 0) {
		return fmt.Errorf("write: %d bytes accepted; the unmapped page starts at %d", n, fb.holeFrom)
	}
	if tc.nt && c.(*Conn).Stats().BytesCopiedNT == 0 {
		return fmt.Errorf("no piece was copied around the caches")
	}
	if !tc.usable {
		// Aborted with the fault as its reason.
		_, err := c.Write([]byte("more"))
		if !errors.Is(err, syscall.EFAULT) {
			return fmt.Errorf("write after the fault: %v, want the fault again", err)
		}
		return nil
	}
	rest := make([]byte, tc.size-n)
	fillStream(rest, n)
	if _, err := c.Write(rest); err != nil {
		return fmt.Errorf("write of the rest: %w", err)
	}
	return c.(*Conn).CloseWrite()
}

func faultingReader(c net.Conn, tc *faultCase, fb *faultBuffer, setHole func(func())) error {
	off := 0
	if tc.split {
		// A Read buffer read into before: splits.
		if _, err := io.ReadFull(c, fb.buf); err != nil {
			return fmt.Errorf("first read: %w", err)
		}
		if err := checkStream(fb.buf, 0, tc.size); err != nil {
			return err
		}
	}
	if tc.at == stepNone {
		fb.unmap()
	} else {
		setHole(fb.unmap)
	}
	var err error
	for off < tc.size {
		end := tc.size
		if tc.chunk > 0 {
			end = min(end, off+tc.chunk)
		}
		var m int
		m, err = c.Read(fb.buf[off:end])
		off += m
		if err != nil {
			break
		}
	}
	if fb.err != nil {
		return fb.err
	}
	if ferr := isFault(err, "read"); ferr != nil {
		return fmt.Errorf("after %d bytes: %w", off, ferr)
	}
	if off > max(fb.holeFrom, 0) {
		return fmt.Errorf("read: %d bytes delivered; the unmapped page starts at %d", off, fb.holeFrom)
	}
	if err := checkStream(fb.buf[:off], 0, tc.size); err != nil {
		return err
	}
	if !tc.usable {
		_, err := c.Read(make([]byte, 10))
		if !errors.Is(err, syscall.EFAULT) {
			return fmt.Errorf("read after the fault: %v, want the fault again", err)
		}
		return nil
	}
	rest, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("read of the rest after %d bytes: %w", off, err)
	}
	if off+len(rest) != tc.size {
		return fmt.Errorf("%d bytes before the fault and %d after, want %d", off, len(rest), tc.size)
	}
	return checkStream(rest, off, tc.size)
}

// otherSide is the peer of the faulting side: it writes the stream, or
// reads and checks it. Its errors must not blame it for the fault.
func otherSide(c net.Conn, tc *faultCase) error {
	if tc.read {
		src := make([]byte, tc.size)
		fillStream(src, 0)
		for i := 0; i < 1+btoi(tc.split); i++ {
			if _, err := c.Write(src); err != nil {
				if tc.usable || errors.Is(err, syscall.EFAULT) {
					return fmt.Errorf("writer: %w", err)
				}
				return nil
			}
		}
		c.(*Conn).CloseWrite()
		if tc.usable {
			return nil
		}
		// Aborted: the reader's fault reaches us as a reset.
		_, err := c.Read(make([]byte, 1))
		if err == nil || errors.Is(err, syscall.EFAULT) {
			return fmt.Errorf("writer after the reader's fault: %v, want a reset", err)
		}
		return nil
	}
	// Reads of the whole transfer into one buffer: direct, and split.
	want := tc.size * (1 + btoi(tc.split))
	buf := make([]byte, tc.size)
	var got []byte
	var err error
	for {
		var m int
		m, err = io.ReadFull(c, buf)
		got = append(got, buf[:m]...)
		if err != nil {
			break
		}
	}
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	if cerr := checkStream(got, 0, tc.size); cerr != nil {
		return fmt.Errorf("reader: %w", cerr)
	}
	switch {
	case tc.usable && (err != nil || len(got) != want):
		return fmt.Errorf("reader: %d of %d bytes, %v", len(got), want, err)
	case !tc.usable && (err == nil || errors.Is(err, syscall.EFAULT)):
		return fmt.Errorf("reader after the writer's fault: %v, want a reset", err)
	}
	return nil
}

// closeDelivered closes c and waits until the peer has taken what we
// wrote (the connection lingers until then): a child that exits first
// loses it.
func closeDelivered(c net.Conn) {
	c.Close()
	select {
	case <-c.(*Conn).tornDown:
	case <-time.After(20 * time.Second):
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// faultHook makes the hook unmap the hole at tc's step, once set.
func faultHook(tc *faultCase) func(func()) {
	var mu sync.Mutex
	var unmap func()
	testHook = func(s step) {
		if s != tc.at {
			return
		}
		mu.Lock()
		f := unmap
		mu.Unlock()
		if f != nil {
			f()
		}
	}
	return func(f func()) {
		mu.Lock()
		unmap = f
		mu.Unlock()
	}
}

func caseByName(name string) (faultCase, bool) {
	for _, tc := range faultCases() {
		if tc.name == name {
			return tc, true
		}
	}
	return faultCase{}, false
}

func TestCampaignFaultInProcess(t *testing.T) {
	base := takeBaseline(t)
	bystander := [2]net.Conn{}
	bystander[0], bystander[1] = pipe(t, nil, nil)
	for _, tc := range faultCases() {
		t.Run(tc.name, func(t *testing.T) {
			if tc.split {
				splitAnyMemory(t)
			}
			t.Cleanup(func() { testHook = nil }) // after the connections are torn down
			setHole := faultHook(&tc)
			w, r := pipe(t, &tc.w, &tc.r)
			mine, peer := w, r
			if tc.read {
				mine, peer = r, w
			}
			errc := make(chan error, 1)
			go func() { errc <- otherSide(peer, &tc) }()
			if err := within(t, "faulting side", 20*time.Second, func() error { return faultingSide(mine, &tc, setHole) }); err != nil {
				t.Fatal(err)
			}
			mine.Close()
			if err := within(t, "other side", 20*time.Second, func() error { return <-errc }); err != nil {
				t.Fatal(err)
			}
			exchange(t, bystander[0], bystander[1])
		})
	}
	bystander[0].Close()
	bystander[1].Close()
	waitTorn(t, bystander[0])
	waitTorn(t, bystander[1])
	base.check(t)
}

// The faulting side in a child: it dials args[1] and runs case args[0].
func init() {
	testutil.RegisterChild("campaign-fault", func(args []string) error {
		tc, ok := caseByName(args[0])
		if !ok {
			return fmt.Errorf("no case %q", args[0])
		}
		if tc.split {
			splitAnyMemory(nil)
		}
		setHole := faultHook(&tc)
		cfg := tc.w
		if tc.read {
			cfg = tc.r
		}
		c, err := dialParent(&cfg, args[1])
		if err != nil {
			say("error " + err.Error())
			return err
		}
		defer closeDelivered(c)
		if err := faultingSide(c, &tc, setHole); err != nil {
			say("error " + err.Error())
			return err
		}
		say("ok")
		return nil
	})
}

func TestCampaignFaultAcrossProcesses(t *testing.T) {
	base := takeBaseline(t)
	for _, tc := range faultCases() {
		t.Run(tc.name, func(t *testing.T) {
			if tc.split {
				splitAnyMemory(t)
			}
			addr := testAddr()
			cfg := tc.r
			if tc.read {
				cfg = tc.w
			}
			lc := ListenConfig{Config: &cfg}
			ln, err := lc.Listen(context.Background(), "sandirect", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			child, n := startNoted(t, "campaign-fault", tc.name, addr)
			defer n.close()
			c := within(t, "accept", 20*time.Second, func() net.Conn {
				c, err := ln.Accept()
				if err != nil {
					t.Errorf("accept: %v", err)
				}
				return c
			})
			if c == nil {
				t.FailNow()
			}
			defer waitTorn(t, c)
			defer c.Close()
			errc := make(chan error, 1)
			go func() { errc <- otherSide(c, &tc) }()
			n.wait(t, "ok")
			if err := within(t, "other side", 20*time.Second, func() error { return <-errc }); err != nil {
				t.Fatal(err)
			}
			c.Close() // the child waits for it (closeDelivered)
			if err := child.Wait(20 * time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
	base.check(t)
}
