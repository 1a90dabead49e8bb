package sockets

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

func init() {
	testutil.RegisterChild("path-listener", pathListenerChild)
}

// pathListenerChild listens on the path args[0], writes one byte to fd 3
// when it does, and serves until killed.
func pathListenerChild(args []string) error {
	ln, err := Listen("sandirect", args[0])
	if err != nil {
		return err
	}
	ready := os.NewFile(3, "ready")
	ready.Write([]byte{1})
	ready.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			buf := make([]byte, 64)
			n, _ := c.Read(buf)
			c.Write(buf[:n])
			c.Close()
		}()
	}
}

// startPathListener runs pathListenerChild on path and waits until it
// listens.
func startPathListener(t *testing.T, path string) *testutil.Child {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := testutil.StartChild(t, "path-listener", []*os.File{w}, path)
	w.Close()
	r.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := r.Read(make([]byte, 1)); err != nil {
		t.Fatalf("listener child not ready: %v; output:\n%s", err, c.Output())
	}
	return c
}

// echoOnce dials path, sends a message and checks the echo.
func echoOnce(t *testing.T, path string) {
	t.Helper()
	c, err := Dial("sandirect", path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	defer func() {
		c.Close()
		waitTorn(t, c)
	}()
	ping(t, c)
}

// ping writes "ping" to c, an echoing connection, and reads it back.
func ping(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("echo %q, %v", buf[:n], err)
	}
}

// TestListenStalePath: a listener killed by SIGKILL leaves its socket
// file; the next Listen on the path takes it over.
func TestListenStalePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ln.sock")
	child := startPathListener(t, path)
	echoOnce(t, path)
	child.Cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("child not dead 10 s after SIGKILL")
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the killed listener left no socket file: %v", err)
	}
	ln, err := Listen("sandirect", path)
	if err != nil {
		t.Fatalf("listen on the stale path: %v", err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			buf := make([]byte, 4)
			n, _ := c.Read(buf)
			c.Write(buf[:n])
			c.Close()
		}
		done <- err
	}()
	echoOnce(t, path)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestListenLivePathNotStolen: a path on which a listener lives — ours in
// another process, a plain Unix stream socket, or no socket at all — is
// never taken: Listen fails with EADDRINUSE and the owner keeps it.
func TestListenLivePathNotStolen(t *testing.T) {
	dir := t.TempDir()
	t.Run("sandirect", func(t *testing.T) {
		path := filepath.Join(dir, "ours.sock")
		startPathListener(t, path)
		if _, err := Listen("sandirect", path); !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("listen on a live path: %v, want EADDRINUSE", err)
		}
		echoOnce(t, path) // still the child's
	})
	t.Run("unix-stream", func(t *testing.T) {
		path := filepath.Join(dir, "stream.sock")
		ul, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer ul.Close()
		if _, err := Listen("sandirect", path); !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("listen on a live stream socket: %v, want EADDRINUSE", err)
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("the stream listener lost its path: %v", err)
		}
		c.Close()
	})
	t.Run("regular-file", func(t *testing.T) {
		path := filepath.Join(dir, "file")
		if err := os.WriteFile(path, []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Listen("sandirect", path); !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("listen on a regular file: %v, want EADDRINUSE", err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != "keep" {
			t.Fatalf("the file was touched: %q, %v", b, err)
		}
	})
}
