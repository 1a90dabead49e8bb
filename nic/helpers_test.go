package nic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

var addrSeq atomic.Int64

// testAddr returns a fresh abstract socket name.
func testAddr() string {
	return fmt.Sprintf("@sandirect-test-%d-%d", os.Getpid(), addrSeq.Add(1))
}

// end is one side of a connection: a device, its CQs and its queue pair.
type end struct {
	d   *Device
	scq *CompletionQueue
	rcq *CompletionQueue
	qp  *QueuePair
}

func openDevice(t testing.TB, cfg *Config) *Device {
	t.Helper()
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if c := d.Cache(); c != nil {
		// The monitor starts in the background; tests of what is cached
		// and of the fds a device holds want it in place.
		c.Monitor()
	}
	return d
}

// pair connects two devices of this process.
func pair(t testing.TB, cfgA, cfgB *Config) (a, b *end) {
	t.Helper()
	return pairWith(t, cfgA, cfgB, func(*QPOptions) {})
}

// pairWith connects two devices of this process with both queue pairs'
// options set by opt.
func pairWith(t testing.TB, cfgA, cfgB *Config, opt func(*QPOptions)) (a, b *end) {
	t.Helper()
	a = &end{d: openDevice(t, cfgA)}
	b = &end{d: openDevice(t, cfgB)}
	for _, e := range []*end{a, b} {
		e.scq, e.rcq = e.d.NewCQ(), e.d.NewCQ()
	}
	ln, err := b.d.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		var err error
		o := QPOptions{SendCQ: b.scq, RecvCQ: b.rcq}
		opt(&o)
		b.qp, err = ln.Accept(o)
		accepted <- err
	}()
	o := QPOptions{SendCQ: a.scq, RecvCQ: a.rcq}
	opt(&o)
	a.qp, err = a.d.Dial(ln.Addr().String(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.qp.Close(); b.qp.Close() })
	return a, b
}

// wait returns the next completion of cq, failing the test after 10 s.
func wait(t testing.TB, cq *CompletionQueue) Completion {
	t.Helper()
	var c [1]Completion
	n, err := cq.Wait(c[:], time.Now().Add(10*time.Second))
	if err != nil || n != 1 {
		t.Fatalf("no completion: %d, %v", n, err)
	}
	return c[0]
}

func register(t testing.TB, d *Device, buf []byte, access Access) *MemoryRegion {
	t.Helper()
	var mr *MemoryRegion
	var err error
	if access&remoteAccess != 0 {
		mr, err = d.RegisterRemote(buf, access)
	} else {
		mr, err = d.Register(buf, access)
	}
	if err != nil {
		t.Fatal(err)
	}
	return mr
}

func alloc(t testing.TB, d *Device, n int) []byte {
	t.Helper()
	b, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendCM writes raw connection-manager messages (type, index) on a's
// connection socket, as a peer of ours never would.
func sendCM(t testing.TB, a *end, typ uint32, idx ...uint32) {
	t.Helper()
	var msg [cmMsgSize]byte
	binary.LittleEndian.PutUint32(msg[0:], typ)
	a.qp.connMu.Lock()
	defer a.qp.connMu.Unlock()
	for i, x := range idx {
		binary.LittleEndian.PutUint32(msg[4:], x)
		if err := sys.SendFds(a.qp.conn, msg[:]); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

// awaitProtocolError waits for b's connection reader to stop and checks
// that b failed with a protocol error that says what.
func awaitProtocolError(t testing.TB, b *end, what string) {
	t.Helper()
	select {
	case <-b.qp.readerDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the queue pair still reads announcements after 10 s")
	}
	if err := b.qp.Err(); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), what) {
		t.Fatalf("queue pair error %v, want a protocol error about %q", err, what)
	}
}
