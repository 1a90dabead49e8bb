package sockets

import (
	"errors"
	"net"
	"slices"
	"testing"
	"time"
)

// gateWaited tells whether a call waits at g, behind its holder.
func (c *Conn) gateWaited(g *gate) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return g.busy && g.free != nil
}

// TestGateSerializesReads: of two Reads waiting at once, one waits for data
// and the other at the reader's gate; each takes one whole Write, and a
// Close returns both waiting calls with net.ErrClosed.
func TestGateSerializesReads(t *testing.T) {
	client, server := pipe(t, nil, nil)
	c := client.(*Conn)
	type res struct {
		s   string
		err error
	}
	read := func(n int) <-chan res {
		ch := make(chan res, 2)
		for range n {
			go func() {
				b := make([]byte, 5)
				k, err := c.Read(b)
				ch <- res{string(b[:k]), err}
			}()
		}
		return ch
	}
	ch := read(2)
	waitFor(t, "a Read waiting at the gate", func() bool { return c.gateWaited(&c.rg) })
	for _, m := range []string{"aaaaa", "bbbbb"} {
		if _, err := server.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for range 2 {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatal(r.err)
			}
			got = append(got, r.s)
		case <-time.After(10 * time.Second):
			t.Fatal("a Read did not return")
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"aaaaa", "bbbbb"}) {
		t.Fatalf("the two Reads took %q, want one whole Write each", got)
	}

	ch = read(2)
	waitFor(t, "a Read waiting at the gate", func() bool { return c.gateWaited(&c.rg) })
	client.Close()
	for range 2 {
		select {
		case r := <-ch:
			if !errors.Is(r.err, net.ErrClosed) {
				t.Errorf("a Read pending at Close: %q, %v; want net.ErrClosed", r.s, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a Read pending at Close did not return")
		}
	}
}
