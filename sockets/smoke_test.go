package sockets

import (
	"bytes"
	"io"
	"testing"
)

func TestSmoke(t *testing.T) {
	c, s := pipe(t, nil, nil)
	msg := []byte("hello, sandirect")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	n, err := s.Read(buf)
	if err != nil || !bytes.Equal(buf[:n], msg) {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	go func() {
		s.Write(big)
		s.(*Conn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("got %d bytes, %v", len(got), err)
	}
	t.Logf("%+v", c.(*Conn).Stats())
	t.Logf("%+v", s.(*Conn).Stats())
}
