package sockets

import (
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

var addrSeq atomic.Int64

// testAddr returns a fresh abstract socket name.
func testAddr() string {
	return fmt.Sprintf("@sandirect-sockets-test-%d-%d", os.Getpid(), addrSeq.Add(1))
}

// pipe connects two shared-memory connections of this process.
func pipe(t testing.TB, dialCfg, listenCfg *Config) (client, server net.Conn) {
	t.Helper()
	lc := ListenConfig{Config: listenCfg}
	ln, err := lc.Listen(t.Context(), "sandirect", testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	d := Dialer{Config: dialCfg}
	client, err = d.Dial("sandirect", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		server = r.c
	case <-time.After(10 * time.Second):
		t.Fatal("accept timed out")
	}
	// The devices' monitors start in the background; tests of what is
	// cached want them in place.
	waitMonitor(client)
	waitMonitor(server)
	t.Cleanup(func() {
		client.Close()
		server.Close()
		waitTorn(t, client)
		waitTorn(t, server)
	})
	return client, server
}

// waitTorn waits until a connection released everything.
func waitTorn(t testing.TB, c net.Conn) {
	t.Helper()
	sc, ok := c.(*Conn)
	if !ok {
		return
	}
	select {
	case <-sc.tornDown:
	case <-time.After(10 * time.Second):
		t.Errorf("connection %v not torn down after 10 s", sc.LocalAddr())
	}
}

// waitMonitor waits until the registration monitor of c's device has
// started.
func waitMonitor(c net.Conn) {
	if sc, ok := c.(*Conn); ok {
		if pc := sc.dev.nic.Cache(); pc != nil {
			pc.Monitor()
		}
	}
}
