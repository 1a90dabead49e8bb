package sockets

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/shm"
)

// TestIdleReadsHoldNoThreads holds thousands of idle connections, each
// with a Read waiting on its server side, the way net/http and gRPC
// servers keep them, and checks that the process's OS threads stay
// bounded: a waiting Read parks its goroutine, it does not hold a thread
// (in a futex wait, every one did). Then it wakes every connection with
// data and checks that each Read gets its own byte.
func TestIdleReadsHoldNoThreads(t *testing.T) {
	n := idleConnections(t)
	for _, mode := range []shm.WaitMode{shm.WaitAdaptive, shm.WaitBlock} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := &Config{Wait: shm.WaitConfig{Mode: mode}}
			addr := testAddr()
			lc := ListenConfig{Config: cfg}
			ln, err := lc.Listen(context.Background(), "sandirect", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			before, err := testutil.Threads()
			if err != nil {
				t.Fatal(err)
			}
			clients := make([]net.Conn, n)
			got := make(chan error, n)
			parked := make(chan struct{}, n)
			for i := range clients {
				d := &Dialer{Config: cfg}
				if clients[i], err = d.Dial("sandirect", addr); err != nil {
					t.Fatalf("dial %d of %d: %v", i, n, err)
				}
				defer clients[i].Close()
				s, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				go func() {
					var b [2]byte
					parked <- struct{}{}
					k, err := s.Read(b[:])
					if err == nil && k != 1 {
						err = fmt.Errorf("read %d bytes, want 1", k)
					}
					if err == nil && b[0] != byte(i%251+1) {
						err = fmt.Errorf("read %q", b[:1])
					}
					got <- err
				}()
			}
			for range n {
				<-parked
			}
			// Every Read is waiting, or about to: wait until the threads
			// settle (a spinning Read parks within its spin time).
			limit := before + runtime.GOMAXPROCS(0) + 20
			var during int
			for deadline := time.Now().Add(20 * time.Second); ; {
				if during, err = testutil.Threads(); err != nil {
					t.Fatal(err)
				}
				if during <= limit || time.Now().After(deadline) {
					break
				}
				runtime.Gosched()
			}
			t.Logf("%d idle connections with a Read waiting: %d threads (%d before, GOMAXPROCS %d)", n, during, before, runtime.GOMAXPROCS(0))
			if during > limit {
				t.Fatalf("%d threads with %d Reads waiting, want at most %d", during, n, limit)
			}
			for i, c := range clients {
				if _, err := c.Write([]byte{byte(i%251 + 1)}); err != nil {
					t.Fatal(err)
				}
			}
			timeout := time.After(60 * time.Second)
			for i := range n {
				select {
				case err := <-got:
					if err != nil {
						t.Fatalf("read %d: %v", i, err)
					}
				case <-timeout:
					t.Fatalf("%d of %d Reads woken", i, n)
				}
			}
		})
	}
}

// idleConnections is how many connections the idle test opens: 2,000, or
// fewer when the fd limit cannot hold them (each connection holds a
// socket on each side here).
func idleConnections(t *testing.T) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	n := 2000
	if fit := int(lim.Cur)/2 - 200; fit < n {
		n = fit
	}
	if n < 2000 {
		t.Logf("RLIMIT_NOFILE %d: %d connections", lim.Cur, n)
	}
	return n
}
