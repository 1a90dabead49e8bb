package sockets

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestEarlyDial: a dial to a listener this process dialed before is early
// (it runs on that listener's answer and writes before the reply), carries
// data both ways at once, large writes too; a listener on the same name
// that answers otherwise (another device) fails the early connection at
// its first use, with a reset, and the next dial is a full one again.
func TestEarlyDial(t *testing.T) {
	// The process's default device, and what it knows of the listener,
	// must outlive the first listener's close until the next dial,
	// however slow the build (TestMain's linger is 50 ms): held here.
	cfg := DefaultConfig()
	d, err := acquireDevice(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.release()
	addr := testAddr()
	accept := func(ln net.Listener) <-chan net.Conn {
		ch := make(chan net.Conn, 1)
		go func() {
			s, err := ln.Accept()
			if err != nil {
				t.Error(err)
			}
			ch <- s
		}()
		return ch
	}
	ln, err := Listen("sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		accepted := accept(ln)
		c, err := Dial("sandirect", addr)
		if err != nil {
			t.Fatal(err)
		}
		if early := c.(*Conn).qp.Early(); early != (i > 0) {
			t.Fatalf("dial %d: early %v", i, early)
		}
		s := <-accepted
		if s == nil {
			t.FailNow()
		}
		exchange(t, c, s) // a rendezvous-sized message each way
		c.Close()
		s.Close()
		waitTorn(t, c)
		waitTorn(t, s)
	}
	ln.Close()
	// The same name, another device (another ring size): another answer.
	lc := ListenConfig{Config: &Config{Window: 16}}
	ln, err = lc.Listen(context.Background(), "sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := accept(ln)
	c, err := Dial("sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	if !c.(*Conn).qp.Early() {
		t.Fatal("the dial after the listener changed is not early: the test tests nothing")
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) || !strings.Contains(err.Error(), "answered otherwise") {
		t.Fatalf("read on an early connection whose listener answered otherwise: %v, want a reset that says so", err)
	}
	c.Close()
	if s := <-accepted; s != nil {
		s.Close()
	}
	accepted = accept(ln)
	c, err = Dial("sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.(*Conn).qp.Early() {
		t.Error("the dial after a changed answer is early again")
	}
	s := <-accepted
	if s == nil {
		t.FailNow()
	}
	defer s.Close()
	exchange(t, c, s)
}
