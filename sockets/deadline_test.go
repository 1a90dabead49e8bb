package sockets

import (
	"bytes"
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
	"time"
)

// pattern returns n bytes that differ from those of another offset.
func pattern(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((off + i) * 7 / 3)
	}
	return b
}

// TestWriteDeadlineRendezvous: a large write whose reader does not read
// ends at its deadline with the bytes it moved, and the stream goes on
// consistently: the reader gets exactly those bytes, then what follows.
func TestWriteDeadlineRendezvous(t *testing.T) {
	for _, tc := range []struct {
		name string
		zc   ZeroCopy
		read bool
	}{
		{"write-rendezvous/cancel", ZeroCopyAuto, false},
		{"read-rendezvous/copy", ZeroCopyNever, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := smallConfig()
			w.ZeroCopy = tc.zc
			r := smallConfig()
			r.NoRDMARead = !tc.read
			c, s := pipe(t, &w, &r)
			c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			var sent []byte
			var err error
			for off := 0; err == nil; {
				b := pattern(off, 100<<10)
				var n int
				n, err = c.Write(b)
				sent = append(sent, b[:n]...)
				off += n
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("write: %v", err)
			}
			c.SetWriteDeadline(time.Time{})
			tail := []byte("and the stream goes on")
			go func() {
				c.Write(tail)
				c.(*Conn).CloseWrite()
			}()
			got, err := io.ReadAll(s)
			if err != nil {
				t.Fatal(err)
			}
			want := append(sent, tail...)
			if !bytes.Equal(got, want) {
				t.Fatalf("got %d bytes, want %d", len(got), len(want))
			}
			st := c.(*Conn).Stats()
			t.Logf("%d bytes before the deadline; cancels %d, copied %d", len(sent), st.Cancels, st.BytesCopied)
			if !tc.read && st.Cancels == 0 {
				t.Fatal("no cancel counted")
			}
		})
	}
}

// TestZeroCopyDeadlineAborts: a zero-copy write that the reader has not
// taken when its deadline passes can only end the connection.
func TestZeroCopyDeadlineAborts(t *testing.T) {
	w := smallConfig()
	w.ZeroCopy = ZeroCopyAlways
	r := smallConfig()
	c, s := pipe(t, &w, &r)
	time.AfterFunc(50*time.Millisecond, func() { c.SetWriteDeadline(time.Now()) })
	_, err := c.Write(make([]byte, 200<<10))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write: %v", err)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write after the abort succeeded")
	}
	buf := make([]byte, 1<<20)
	for err = nil; err == nil; {
		_, err = s.Read(buf)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reader: %v, want a reset", err)
	}
}

// TestReadDeadlineStaging: a read deadline during a write rendezvous
// leaves the transfer to the staging buffer; the next Read gets the data.
func TestReadDeadlineStaging(t *testing.T) {
	w := smallConfig()
	r := smallConfig()
	r.NoRDMARead = true
	c, s := pipe(t, &w, &r)
	data := pattern(0, 300<<10)
	go c.Write(data)
	s.SetReadDeadline(time.Now().Add(time.Second))
	var got []byte
	buf := make([]byte, 1000)
	for len(got) < len(data) {
		n, err := s.Read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.SetReadDeadline(time.Now().Add(time.Second))
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("data differs")
	}
	if st := s.(*Conn).Stats(); st.BytesStaged == 0 {
		t.Fatalf("nothing staged: %+v", st)
	}
}
