package sockets

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

func init() {
	testutil.RegisterChild("fallback-dial", fallbackDialChild)
}

// ourFds lists the fds that only a device of ours opens: memfd segments,
// BPF maps, programs and links, userfaultfds.
func ourFds() []string {
	var out []string
	for _, f := range testutil.Snapshot().Fds {
		if strings.HasPrefix(f, "/memfd:") || strings.Contains(f, "bpf") || strings.Contains(f, "userfaultfd") {
			out = append(out, f)
		}
	}
	return out
}

// fallbackDialChild runs in a fresh process with nothing of ours open:
// "tcp" dials to a plain TCP service on this host must open no device
// (no memfd, no BPF object), reach the service, and probe the
// shared-memory name once, not at every dial.
func fallbackDialChild([]string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	addr := ln.Addr().String()
	name := tcpName(ln.Addr().(*net.TCPAddr).Port)
	for i := range 3 {
		c, err := Dial("tcp", addr)
		if err != nil {
			return fmt.Errorf("dial %d: %w", i, err)
		}
		if _, ok := c.(*net.TCPConn); !ok {
			c.Close()
			return fmt.Errorf("dial %d: got a %T, want a *net.TCPConn", i, c)
		}
		msg := []byte("ping")
		if _, err := c.Write(msg); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, msg); err != nil || string(msg) != "ping" {
			return fmt.Errorf("echo: %q, %v", msg, err)
		}
		c.Close()
		if !noListener.known(name) {
			return fmt.Errorf("dial %d: the name %s without a listener is not remembered", i, name)
		}
	}
	// A "sandirect" dial to a name nobody listens on fails, as cheaply.
	_, err = Dial("sandirect", "@sandirect-test-nobody-"+fmt.Sprint(os.Getpid()))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("dial to nobody: %v, want ECONNREFUSED", err)
	}
	if n := devicesOpened.Load(); n != 0 {
		return fmt.Errorf("%d devices opened by fallback dials", n)
	}
	if fds := ourFds(); len(fds) > 0 {
		return fmt.Errorf("fallback dials left device fds: %v", fds)
	}
	return nil
}

func TestFallbackDialCreatesNoDevice(t *testing.T) {
	c := testutil.StartChild(t, "fallback-dial", nil)
	if err := c.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestNegativeCache(t *testing.T) {
	n := negativeCache{ttl: time.Hour}
	if n.known("a") {
		t.Fatal("empty cache knows a")
	}
	n.add("a")
	if !n.known("a") || n.known("b") {
		t.Fatal("after add(a): known(a) false or known(b) true")
	}
	n.forget("a")
	if n.known("a") {
		t.Fatal("known(a) after forget")
	}
	expired := negativeCache{ttl: -time.Second}
	expired.add("a")
	if expired.known("a") {
		t.Fatal("an expired name is still known")
	}
	for i := range negativeCacheMax + 10 {
		n.add(fmt.Sprint(i))
	}
	if len(n.m) > negativeCacheMax {
		t.Fatalf("%d names remembered, bound %d", len(n.m), negativeCacheMax)
	}
}

// TestDialAfterListenerStarts: a name remembered without a listener is
// forgotten when a listener of ours starts on it in this process.
func TestDialAfterListenerStarts(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := tl.Addr().(*net.TCPAddr).Port
	tl.Close()
	noListener.add(tcpName(port))
	ln, err := Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Skipf("port %d taken again: %v", port, err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*Conn); !ok {
		t.Fatalf("dial got a %T, want a shared-memory *Conn", c)
	}
	select {
	case s := <-accepted:
		c.Close()
		s.Close()
		waitTorn(t, c)
		waitTorn(t, s)
	case <-time.After(10 * time.Second):
		t.Fatal("accept timed out")
	}
}

// TestDeviceLinger: a device outlives its last connection by
// deviceLinger, so that the next dial reuses it, and closes after it.
func TestDeviceLinger(t *testing.T) {
	defer func(d time.Duration) { deviceLinger = d }(deviceLinger)
	closeIdleDevices()
	before := testutil.Snapshot()
	deviceLinger = time.Hour
	opened := devicesOpened.Load()
	for range 3 {
		c, s := pipe(t, nil, nil)
		c.Close()
		s.Close()
		waitTorn(t, c)
		waitTorn(t, s)
	}
	if n := devicesOpened.Load() - opened; n != 1 {
		t.Errorf("%d devices opened for 3 connections one after another, want 1", n)
	}
	if n := closeIdleDevices(); n != 1 {
		t.Errorf("%d idle devices closed, want 1", n)
	}
	if err := before.CheckLeaks(); err != nil {
		t.Fatalf("after closing the idle device: %v", err)
	}
	deviceLinger = time.Millisecond
	c, s := pipe(t, nil, nil)
	c.Close()
	s.Close()
	waitTorn(t, c)
	waitTorn(t, s)
	if err := before.CheckLeaks(); err != nil {
		t.Fatalf("deviceLinger after the last connection: %v", err)
	}
	devices.mu.Lock()
	n := len(devices.m)
	devices.mu.Unlock()
	if n != 0 {
		t.Errorf("%d devices open after their linger", n)
	}
}
