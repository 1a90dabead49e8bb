package sockets

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// fillPattern fills b with bytes that depend on round.
func fillPattern(b []byte, round int) {
	for i := range b {
		b[i] = byte(i*7 + round*13 + i>>10)
	}
}

// TestSharedBufferWrite: writes from a buffer from AllocBuffer are read
// by the peer in place (zero copy, counted as ZeroShared) at every size,
// also past ZeroCopyMax where an ordinary buffer is copied; every byte
// arrives; FreeBuffer gives it back once, and refuses memory of others.
func TestSharedBufferWrite(t *testing.T) {
	c, s := pipe(t, nil, nil)
	const size = 8 << 20 // past the default ZeroCopyMax: ordinary buffers are copied
	buf, err := AllocBuffer(c, size)
	if err != nil {
		t.Fatal(err)
	}
	if len(buf) != size {
		t.Fatalf("AllocBuffer gave %d bytes, want %d", len(buf), size)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(s)
		got <- b
	}()
	var want bytes.Buffer
	const rounds = 3
	for r := range rounds {
		fillPattern(buf, r)
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		want.Write(buf)
	}
	st := c.(*Conn).Stats()
	if st.ZeroShared < rounds || st.CopyChosen != 0 || st.BytesCopied != 0 {
		t.Errorf("%d writes from a shared buffer: %d in place, %d copied (%d bytes); want every one in place", rounds, st.ZeroShared, st.CopyChosen, st.BytesCopied)
	}
	// An ordinary buffer of the same size is copied (the default has no
	// zero-copy band for it).
	plain := bytes.Repeat([]byte{5}, size)
	if _, err := c.Write(plain); err != nil {
		t.Fatal(err)
	}
	want.Write(plain)
	if st2 := c.(*Conn).Stats(); st2.CopyChosen == 0 || st2.ZeroShared != st.ZeroShared {
		t.Errorf("an ordinary 8 MiB buffer: %d copied, %d more in place; want copied", st2.CopyChosen, st2.ZeroShared-st.ZeroShared)
	}
	c.(*Conn).CloseWrite()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("received %d bytes, want %d, or they differ", len(b), want.Len())
	}
	if err := FreeBuffer(buf); err != nil {
		t.Fatalf("FreeBuffer: %v", err)
	}
	if err := FreeBuffer(buf); err == nil {
		t.Error("a second FreeBuffer of the same buffer succeeded")
	}
	if err := FreeBuffer(plain); err == nil {
		t.Error("FreeBuffer of memory not from AllocBuffer succeeded")
	}
}

// TestSharedBufferOutlivesConn: a buffer from AllocBuffer stays valid
// after its connection closes (it holds the device), and FreeBuffer then
// closes the device with it: nothing is left mapped.
func TestSharedBufferOutlivesConn(t *testing.T) {
	before := testutil.Snapshot()
	cfg := &Config{TempMemory: 3 << 20} // a device of its own
	c, s := pipe(t, cfg, cfg)
	buf, err := AllocBuffer(c, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	c.Close()
	fillPattern(buf, 1) // still mapped: no fault
	if b, err := AllocBuffer(c, 4096); !errors.Is(err, net.ErrClosed) {
		t.Errorf("AllocBuffer on a closed connection: %v, want net.ErrClosed", err)
		FreeBuffer(b)
	}
	if err := FreeBuffer(buf); err != nil {
		t.Fatal(err)
	}
	if err := Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := before.CheckLeaks(); err != nil {
		t.Fatal(err)
	}
}

// TestSharedBufferNotOurs: on a connection that is not ours, AllocBuffer
// gives ordinary memory and FreeBuffer takes it back.
func TestSharedBufferNotOurs(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	buf, err := AllocBuffer(a, 100)
	if err != nil || len(buf) != 100 {
		t.Fatalf("AllocBuffer on a net.Pipe: %d bytes, %v", len(buf), err)
	}
	if err := FreeBuffer(buf); err != nil {
		t.Fatal(err)
	}
}

// TestSharedBufferAcrossProcesses: a real peer process reads writes from
// a shared buffer in place, in both rendezvous, and every byte arrives
// (hashed by the peer).
func TestSharedBufferAcrossProcesses(t *testing.T) {
	const size, rounds = 1 << 20, 6
	for _, name := range []string{"read/auto", "write/auto"} {
		t.Run(name, func(t *testing.T) {
			w := integrityModes()[name][0]
			addr := testAddr()
			child := testutil.StartChild(t, "stream", nil, "sink", addr, name, "11", "6291456")
			c := dialChild(t, child, &w, "sandirect", addr)
			defer c.Close()
			buf, err := AllocBuffer(c, size)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			for r := range rounds {
				fillPattern(buf, r)
				h.Write(buf)
				if _, err := c.Write(buf); err != nil {
					t.Fatalf("write %d: %v\n%s", r, err, child.Output())
				}
			}
			c.(*Conn).CloseWrite()
			sum := make([]byte, sha256.Size)
			if _, err := io.ReadFull(c, sum); err != nil {
				t.Fatalf("hash: %v\n%s", err, child.Output())
			}
			if !bytes.Equal(sum, h.Sum(nil)) {
				t.Fatalf("child hashed %x, want %x", sum, h.Sum(nil))
			}
			// The write rendezvous always writes from the source itself.
			st := c.(*Conn).Stats()
			if name == "read/auto" && st.ZeroShared == 0 || st.CopyChosen != 0 || st.BytesCopied != 0 {
				t.Errorf("%d rendezvous in place, %d copied (%d bytes); want all in place", st.ZeroShared, st.CopyChosen, st.BytesCopied)
			}
			if err := child.Wait(20 * time.Second); err != nil {
				t.Fatal(err)
			}
			c.Close()
			if err := FreeBuffer(buf); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFreeBufferDuringWrite: FreeBuffer of a buffer a write is reading
// from fails and changes nothing — the write completes, every byte
// arrives — and succeeds once the write is done.
func TestFreeBufferDuringWrite(t *testing.T) {
	c, s := pipe(t, nil, nil)
	const size = 4 << 20
	buf, err := AllocBuffer(c, size)
	if err != nil {
		t.Fatal(err)
	}
	fillPattern(buf, 3)
	want := bytes.Clone(buf)
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(buf)
		wrote <- err
	}()
	// The write has registered its source once its rts is out; the peer
	// reads nothing yet, so the write waits.
	deadline := time.Now().Add(10 * time.Second)
	for c.(*Conn).Stats().Rendezvous == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no rendezvous after 10 s")
		}
		runtime.Gosched()
	}
	if err := FreeBuffer(buf); err == nil {
		t.Fatal("FreeBuffer succeeded while a write from the buffer was in flight")
	}
	got := make([]byte, size)
	if _, err := io.ReadFull(s, got); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("received bytes differ")
	}
	if err := FreeBuffer(buf); err != nil {
		t.Fatalf("FreeBuffer after the write: %v", err)
	}
}

// TestLargeReadsAroundCaches: a Read into a buffer of ntReadMin or more
// takes its rendezvous data with non-temporal stores (BytesDirectNT), a
// smaller one through the caches, and every byte arrives either way.
func TestLargeReadsAroundCaches(t *testing.T) {
	c, s := pipe(t, nil, nil)
	const size = 3 * ntReadMin
	msg := make([]byte, size)
	fillPattern(msg, 5)
	wrote := make(chan error, 1)
	go func() {
		for range 2 {
			if _, err := c.Write(msg); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	got := make([]byte, size)
	if _, err := io.ReadFull(s, got); err != nil { // large Reads
		t.Fatal(err)
	}
	st := s.(*Conn).Stats()
	if !bytes.Equal(got, msg) {
		t.Fatal("large reads: bytes differ")
	}
	if st.BytesDirectNT == 0 || st.BytesDirectNT > st.BytesDirect {
		t.Fatalf("large reads: %d bytes direct, %d of them non-temporal; want some", st.BytesDirect, st.BytesDirectNT)
	}
	small := make([]byte, ntReadMin/2)
	for off := 0; off < size; off += len(small) { // small Reads
		if _, err := io.ReadFull(s, small); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(small, msg[off:off+len(small)]) {
			t.Fatalf("small reads: bytes at %d differ", off)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if st2 := s.(*Conn).Stats(); st2.BytesDirectNT != st.BytesDirectNT {
		t.Errorf("Reads of %d bytes took %d bytes around the caches; want none", len(small), st2.BytesDirectNT-st.BytesDirectNT)
	}
}
