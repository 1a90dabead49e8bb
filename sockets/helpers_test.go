package sockets

import (
	"errors"
	"fmt"
	"io"
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
	accepted := acceptAsync(ln)
	d := Dialer{Config: dialCfg}
	client, err = d.Dial("sandirect", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if server, err = accepted(); err != nil {
		t.Fatal(err)
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

// acceptAsync starts an Accept on ln; the function it returns waits for
// it, 10 s at most.
func acceptAsync(ln net.Listener) func() (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	return func() (net.Conn, error) {
		select {
		case r := <-ch:
			return r.c, r.err
		case <-time.After(10 * time.Second):
			return nil, errors.New("accept timed out")
		}
	}
}

// readToEOF reads c to its end, 10 s at most.
func readToEOF(c net.Conn) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	return io.ReadAll(c)
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

// setDeviceLinger sets deviceLinger and returns the old value. Under
// devices.mu, where release reads it: earlier tests' connections may
// still be tearing down.
func setDeviceLinger(d time.Duration) (old time.Duration) {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	old, deviceLinger = deviceLinger, d
	return old
}
