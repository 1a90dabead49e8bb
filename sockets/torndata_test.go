package sockets

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestReadAfterTeardown: a connection torn down by its peer's reset still
// delivers the bytes it received before the reset, intact, after its
// control pool went back to the device and other connections took and
// used the memory (or it was unmapped) — then the reset.
func TestReadAfterTeardown(t *testing.T) {
	cfg := DefaultConfig()
	c, s := pipe(t, &cfg, &cfg)
	if _, err := s.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := awaitRx(c.(*Conn), 1); err != nil {
		t.Fatal(err)
	}
	// s closes with data unread: an abort, which resets c.
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := awaitRx(s.(*Conn), 1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// Drive c, without a Read, until the reset has torn it down.
	if !driveUntilFailed(c.(*Conn), 10*time.Second) {
		t.Fatal("no reset after 10 s")
	}
	waitTorn(t, c)
	// New connections take the pools given back and write through them.
	var others []net.Conn
	for range 4 {
		a, b := pipe(t, &cfg, &cfg)
		if _, err := a.Write([]byte("XXXXXXXXXXXXXXXX")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, make([]byte, 16)); err != nil {
			t.Fatal(err)
		}
		others = append(others, a, b)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "hello" {
		t.Fatalf("read after teardown: %q, %v; want %q", got, err, "hello")
	}
	if _, err := c.Read(got); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("then: %v, want a reset", err)
	}
	for _, o := range others {
		o.Close()
	}
}
