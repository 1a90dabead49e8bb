package sockets

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// The echo child: listens on args[0], accepts args[1] connections and
// echoes each until EOF.
func init() {
	testutil.RegisterChild("echo", func(args []string) error {
		n, _ := strconv.Atoi(args[1])
		ln, err := Listen("sandirect", args[0])
		if err != nil {
			return err
		}
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if _, err := io.Copy(c, c); err != nil {
					errs <- err
				}
			}()
		}
		ln.Close()
		wg.Wait()
		close(errs)
		for err := range errs {
			return err
		}
		return Flush(context.Background())
	})
}

// TestManyConnections opens 256 connections to another process, all at
// once, and echoes through each.
func TestManyConnections(t *testing.T) {
	const n = 256
	addr := testAddr()
	child := testutil.StartChild(t, "echo", nil, addr, strconv.Itoa(n))
	conns := make([]net.Conn, n)
	conns[0] = dialChild(t, child, nil, "sandirect", addr)
	for i := 1; i < n; i++ {
		c, err := Dial("sandirect", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns[i] = c
	}
	echoAll(t, conns, func(i int) int { return 8 * (100 + i*scaled(40)) }, 20*time.Second)
	if err := child.Wait(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		waitTorn(t, c)
	}
}

// echoAll writes a message of size(i) bytes on conns[i], all connections
// at once, reads its echo back within timeout and compares it, then
// closes every connection (the echo child then exits).
func echoAll(t *testing.T, conns []net.Conn, size func(i int) int, timeout time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := bytes.Repeat([]byte(fmt.Sprintf("conn %d ", i)), size(i)/8)
			go c.Write(msg)
			got := make([]byte, len(msg))
			c.SetReadDeadline(time.Now().Add(timeout))
			if _, err := io.ReadFull(c, got); err != nil {
				errs <- fmt.Errorf("conn %d: %w", i, err)
				return
			}
			if !bytes.Equal(got, msg) {
				errs <- fmt.Errorf("conn %d: echo differs", i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, c := range conns {
		c.Close()
	}
}

// TestHTTP runs a net/http server and client over our listener and
// dialer, on a "tcp" address of this host: the connections are shared
// memory.
func TestHTTP(t *testing.T) {
	ln, err := Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("sandirect "), 1<<20) // 10 MiB
	var shm, tcp sync.Map
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			got, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			w.Header().Set("X-Got", strconv.Itoa(len(got)))
			w.Write(body[:n])
		}),
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				if _, ok := c.(*Conn); ok {
					shm.Store(c, true)
				} else {
					tcp.Store(c, true)
				}
			}
		},
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	var d Dialer
	client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	for _, n := range []int{0, 1, 100, 5000, 100 << 10, 3 << 20, len(body)} {
		req := bytes.NewReader(body[:n/2])
		resp, err := client.Post("http://"+ln.Addr().String()+"/?n="+strconv.Itoa(n), "application/octet-stream", req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, body[:n]) || resp.Header.Get("X-Got") != strconv.Itoa(n/2) {
			t.Fatalf("n=%d: got %d bytes, %v; server got %s", n, len(got), err, resp.Header.Get("X-Got"))
		}
	}
	client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Fatal(err)
	}
	nshm, ntcp := 0, 0
	shm.Range(func(k, v any) bool { nshm++; waitTorn(t, k.(net.Conn)); return true })
	tcp.Range(func(k, v any) bool { ntcp++; return true })
	if nshm == 0 || ntcp != 0 {
		t.Fatalf("%d shared-memory and %d TCP connections", nshm, ntcp)
	}
	if err := Flush(ctx); err != nil {
		t.Fatal(err)
	}
}
