package sockets

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// Short of locked memory (issue 21): an unprivileged process (uid 65534)
// under a low RLIMIT_MEMLOCK reads, or writes, a 64 MiB stream of writes
// from 64 B to 16 MiB, with its peer (uid 65534 too, the default 8 MiB)
// on the other side; both hash what passed and the hashes must match the
// stream's. Pinning failures take the paths that pin less (lowmem.go):
// nothing fails, nothing is lost. Below the smallest limit that carries
// data, Dial fails with ENOBUFS.

const lowmemStream = 64 << 20

// lowmemWrites and lowmemReads are the sizes the two sides cycle through.
var (
	lowmemWrites = []int{64, 4 << 10, 100 << 10, 1 << 20, 16 << 20, 3<<20 + 17, 300 << 10}
	lowmemReads  = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 100<<10 + 3}
)

// lowmemConfig is the configuration of both sides: the default, or the
// write rendezvous towards the low side's reads.
func lowmemConfig(noRead bool) *Config {
	return &Config{NoRDMARead: noRead}
}

// playStream writes the stream to c (writer) or reads it from c, and
// returns the sha256 of what passed and its length.
func playStream(c net.Conn, writer bool, total int) (string, int, error) {
	h := sha256.New()
	buf := make([]byte, 16<<20)
	n := 0
	for i := 0; n < total || !writer; i++ {
		if writer {
			b := buf[:min(lowmemWrites[i%len(lowmemWrites)], total-n)]
			fillStream(b, n)
			m, err := c.Write(b)
			h.Write(b[:m])
			n += m
			if err != nil {
				return "", n, fmt.Errorf("write at %d: %w", n, err)
			}
			continue
		}
		m, err := c.Read(buf[:lowmemReads[i%len(lowmemReads)]])
		h.Write(buf[:m])
		n += m
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", n, fmt.Errorf("read at %d: %w", n, err)
		}
	}
	if writer {
		if err := c.(*Conn).CloseWrite(); err != nil {
			return "", n, err
		}
		// Wait for the reader's close: what we wrote is taken.
		if _, err := c.Read(buf[:1]); err != io.EOF {
			return "", n, fmt.Errorf("after the stream: %v, want EOF", err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func streamHash(total int) string {
	h := sha256.New()
	b := make([]byte, 1<<20)
	for n := 0; n < total; n += len(b) {
		b = b[:min(len(b), total-n)]
		fillStream(b, n)
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// The two children: args are the address, the role ("writer" or
// "reader"), NoRDMARead ("1"), the stream's length, and for the dialer its
// RLIMIT_MEMLOCK.
func init() {
	testutil.RegisterChild("lowmem-listen", func(args []string) error {
		total, _ := strconv.Atoi(args[3])
		ln, err := (&ListenConfig{Config: lowmemConfig(args[2] == "1")}).Listen(context.Background(), "sandirect", args[0])
		if err != nil {
			say("error " + err.Error())
			return err
		}
		defer ln.Close()
		say("listening")
		c, err := ln.Accept()
		if err != nil {
			say("error " + err.Error())
			return err
		}
		defer closeDelivered(c)
		return reportStream(c, args[1] == "writer", total)
	})
	testutil.RegisterChild("lowmem-dial", func(args []string) error {
		total, _ := strconv.Atoi(args[3])
		limit, _ := strconv.ParseUint(args[4], 10, 64)
		if err := sys.SetMemlockLimit(limit, limit); err != nil {
			say("error " + err.Error())
			return err
		}
		d := Dialer{Config: lowmemConfig(args[2] == "1")}
		c, err := d.Dial("sandirect", args[0])
		if err != nil {
			if errors.Is(err, syscall.ENOBUFS) {
				say("enobufs " + err.Error())
				return nil
			}
			say("error " + err.Error())
			return err
		}
		defer closeDelivered(c)
		if args[1] == "probe" {
			// What a connection keeps pinned: its control memory.
			say(fmt.Sprintf("ok held %d", c.(*Conn).dev.ctlHeld()))
			return nil
		}
		return reportStream(c, args[1] == "writer", total)
	})
}

func reportStream(c net.Conn, writer bool, total int) error {
	sum, n, err := playStream(c, writer, total)
	if err != nil {
		say("error " + err.Error())
		return err
	}
	say(fmt.Sprintf("ok %s %d", sum, n))
	return nil
}

// lowmemRun runs one low-memory dialer against an unprivileged listener
// and returns what the dialer said last.
func lowmemRun(t *testing.T, role string, noRead bool, limit, total int) (listener, dialer string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to start children as uid 65534")
	}
	other := "reader"
	if role == "reader" {
		other = "writer"
	}
	nr := "0"
	if noRead {
		nr = "1"
	}
	cred := &syscall.Credential{Uid: 65534, Gid: 65534}
	addr := testAddr()
	lc, ln := startNotedAs(t, cred, "lowmem-listen", addr, other, nr, strconv.Itoa(total))
	ln.wait(t, "listening")
	dc, dn := startNotedAs(t, cred, "lowmem-dial", addr, role, nr, strconv.Itoa(total), strconv.Itoa(limit))
	dialer = dn.last(t, 120*time.Second)
	if err := dc.Wait(20 * time.Second); err != nil {
		t.Fatalf("dialer: %v", err)
	}
	if dialer[:2] == "ok" && role != "probe" {
		listener = ln.last(t, 20*time.Second)
	}
	lc.Kill()
	return listener, dialer
}

func TestCampaignLowMemlock(t *testing.T) {
	want := fmt.Sprintf("ok %s %d", streamHash(lowmemStream), lowmemStream)
	for _, tc := range []struct {
		role   string
		limit  int
		noRead bool
	}{
		{"reader", 64 << 10, false},
		{"reader", 64 << 10, true},
		{"reader", 128 << 10, false},
		{"reader", 1 << 20, false},
		{"writer", 64 << 10, false},
		{"writer", 64 << 10, true},
		{"writer", 128 << 10, false},
		{"writer", 1 << 20, false},
	} {
		mode := "read"
		if tc.noRead {
			mode = "write"
		}
		t.Run(fmt.Sprintf("%s/%s/memlock=%dKiB", tc.role, mode, tc.limit>>10), func(t *testing.T) {
			l, d := lowmemRun(t, tc.role, tc.noRead, tc.limit, lowmemStream)
			if d != want || l != want {
				t.Fatalf("dialer said %q, listener %q; want %q", d, l, want)
			}
		})
	}
}

// TestCampaignLowMemlockDial: the smallest RLIMIT_MEMLOCK that carries
// data with the default Config is what a connection keeps pinned (its
// control memory: 12 buffers of 4 KiB and the doorbell's page, asked of a
// first connection) and a page to stage received data in (lowmem.go).
// One page below it Dial fails with ENOBUFS; at it, data flows.
func TestCampaignLowMemlockDial(t *testing.T) {
	_, d := lowmemRun(t, "probe", false, 8<<20, 0)
	var held int
	if _, err := fmt.Sscanf(d, "ok held %d", &held); err != nil || held <= 0 {
		t.Fatalf("probe said %q", d)
	}
	lowmemMin := held + sys.PageSize
	t.Logf("a connection holds %d bytes pinned: the least RLIMIT_MEMLOCK that carries data is %d", held, lowmemMin)
	t.Run("below", func(t *testing.T) {
		_, d := lowmemRun(t, "reader", false, lowmemMin-4096, 1<<20)
		if len(d) < 7 || d[:7] != "enobufs" {
			t.Fatalf("dial at RLIMIT_MEMLOCK %d: %q, want ENOBUFS", lowmemMin-4096, d)
		}
		t.Log(d)
	})
	t.Run("at", func(t *testing.T) {
		want := fmt.Sprintf("ok %s %d", streamHash(4<<20), 4<<20)
		if l, d := lowmemRun(t, "reader", false, lowmemMin, 4<<20); d != want || l != want {
			t.Fatalf("dialer said %q, listener %q; want %q", d, l, want)
		}
	})
}

// startNotedAs is startNoted for a child with credentials cred.
func startNotedAs(t *testing.T, cred *syscall.Credential, name string, args ...string) (*testutil.Child, *notes) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	child := testutil.StartChildAs(t, cred, name, []*os.File{w}, args...)
	w.Close()
	return child, &notes{f: r, r: bufio.NewReader(r), child: child}
}

// last returns the child's next line that starts with "ok", "enobufs" or
// "error", waiting at most d.
func (n *notes) last(t *testing.T, d time.Duration) string {
	t.Helper()
	n.f.SetReadDeadline(time.Now().Add(d))
	for {
		l, err := n.r.ReadString('\n')
		if err != nil {
			t.Fatalf("waiting for the child's result: %v; output:\n%s", err, n.child.Output())
		}
		l = l[:len(l)-1]
		for _, p := range []string{"ok", "enobufs", "error"} {
			if len(l) >= len(p) && l[:len(p)] == p {
				return l
			}
		}
	}
}
