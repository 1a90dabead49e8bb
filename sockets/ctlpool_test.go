package sockets

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// TestConnectionsShareRegions opens far more connections than a device
// has regions, echoes through every one, closes them, and opens one more:
// a connection registers nothing of its own (its messages are written and
// read in the rings), so a device of two regions — the doorbell and one
// spare — serves them all.
func TestConnectionsShareRegions(t *testing.T) {
	const n = 100
	cfg := DefaultConfig()
	cfg.MaxRegions = 2
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
	// A connection that registered anything would have failed to open.
	d := clients[0].(*Conn).dev
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
	c, s := pipe(t, &cfg, &cfg)
	if c.(*Conn).dev != d {
		t.Fatal("a new device: the listener did not keep it")
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
