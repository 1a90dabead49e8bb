package sockets

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// TestConnectionsShareRegions opens far more connections than a device
// has regions for three apiece (what a connection registered before its
// control buffers came from shared slabs), echoes through every one,
// closes them, and opens one more: the slabs are given back, but one, and
// reused.
func TestConnectionsShareRegions(t *testing.T) {
	const n = 100 // 200 ends on one device: 600 regions the old way
	cfg := DefaultConfig()
	cfg.MaxRegions = 64
	// A listener keeps the device while connections come and go.
	lc := ListenConfig{Config: &cfg}
	ln, err := lc.Listen(t.Context(), "sandirect", testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var clients, servers []net.Conn
	for range n {
		c, s := pipe(t, &cfg, &cfg)
		clients, servers = append(clients, c), append(servers, s)
	}
	d := clients[0].(*Conn).dev
	slabs := func() (slabs, pools int) {
		d.ctl.mu.Lock()
		defer d.ctl.mu.Unlock()
		for _, cl := range d.ctl.classes {
			for _, s := range cl.slabs {
				slabs++
				pools += s.used
			}
		}
		return slabs, pools
	}
	// Slabs of 1, 2, then ctlSlabMax pools.
	want := 2 + (2*n-3+ctlSlabMax-1)/ctlSlabMax
	if s, p := slabs(); p != 2*n || s > want {
		t.Fatalf("%d pools in %d slabs for %d connection ends, want %d pools in at most %d", p, s, 2*n, 2*n, want)
	}
	for i, c := range clients {
		msg := bytes.Repeat([]byte{byte(i)}, 100+i)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(servers[i], got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("connection %d: %v, data equal %v", i, err, bytes.Equal(got, msg))
		}
	}
	for i := range clients {
		clients[i].Close()
		servers[i].Close()
		waitTorn(t, clients[i])
		waitTorn(t, servers[i])
	}
	if s, p := slabs(); p != 0 || s != 1 {
		t.Fatalf("%d pools in %d slabs after every connection closed, want none in one slab", p, s)
	}
	c, s := pipe(t, &cfg, &cfg)
	if c.(*Conn).dev != d {
		t.Fatal("a new device: the listener did not keep it")
	}
	if s, p := slabs(); p != 2 || s != 1 {
		t.Fatalf("%d pools in %d slabs for one connection, want 2 in the slab kept", p, s)
	}
	defer c.Close()
	defer s.Close()
	if _, err := c.Write([]byte("again")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "again" {
		t.Fatalf("after reuse: %q, %v", got, err)
	}
}
