package nic

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// The scoped child (uid 65534, admitted by the parent's AllowUIDs): it
// receives two regions of the parent's device memory, one allocated for
// its uid and one for the parent's own, writes into the first, which must
// work, and into the second, which must fail at once with a remote access
// error — it never mapped that memory.
func init() {
	testutil.RegisterChild("scoped", func(args []string) error {
		cfg := DefaultConfig()
		cfg.AllowUIDs = []uint32{0}
		d, err := Open(&cfg)
		if err != nil {
			return err
		}
		defer d.Close()
		scq, rcq := d.NewCQ(), d.NewCQ()
		qp, err := d.Dial(args[0], QPOptions{SendCQ: scq, RecvCQ: rcq})
		if err != nil {
			return err
		}
		buf := make([]byte, 4096)
		mr, err := d.Register(buf, AccessLocalWrite)
		if err != nil {
			return err
		}
		if err := qp.PostRecv(RecvWR{Buf: buf[:64], LKey: mr.LKey}); err != nil {
			return err
		}
		var c [1]Completion
		if n, err := rcq.Wait(c[:], time.Now().Add(10*time.Second)); n != 1 || err != nil || c[0].Status != StatusSuccess {
			return fmt.Errorf("receive: %d, %v, %+v", n, err, c[0])
		}
		le := binary.LittleEndian
		ours, ourKey := le.Uint64(buf[0:]), le.Uint64(buf[8:])
		theirs, theirKey := le.Uint64(buf[16:]), le.Uint64(buf[24:])
		copy(buf[64:], "written by uid 65534")
		if err := qp.PostSend(SendWR{ID: 1, Op: OpWrite, Local: buf[64:84], LKey: mr.LKey, Remote: ours, RKey: ourKey}); err != nil {
			return err
		}
		if n, err := scq.Wait(c[:], time.Now().Add(10*time.Second)); n != 1 || err != nil || c[0].Status != StatusSuccess {
			return fmt.Errorf("write into memory shared with us: %d, %v, %+v", n, err, c[0].Err())
		}
		start := time.Now()
		if err := qp.PostSend(SendWR{ID: 2, Op: OpWrite, Local: buf[64:84], LKey: mr.LKey, Remote: theirs, RKey: theirKey}); err != nil {
			return err
		}
		n, err := scq.Wait(c[:], time.Now().Add(10*time.Second))
		if n != 1 || err != nil || c[0].Status != StatusRemoteAccess || !strings.Contains(c[0].Err().Error(), "not shared") {
			return fmt.Errorf("write into memory not shared with us: %d, %v, %v", n, err, c[0].Err())
		}
		if waited := time.Since(start); waited > 5*time.Second {
			return fmt.Errorf("the refused write took %v", waited)
		}
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			return err
		}
		if k := strings.Count(string(maps), "memfd:sandirect:mem"); k != 1 {
			return fmt.Errorf("%d mappings of the parent's device memory, want 1 (its memory for our uid)", k)
		}
		return nil
	})
}

// TestDeviceMemoryScopedByUID: a peer of another uid, admitted by
// AllowUIDs, maps only the device memory allocated for its uid (AllocFor);
// memory from Alloc, for peers of our own uid, stays out of its reach, and
// RDMA on it fails with a remote access error.
func TestDeviceMemoryScopedByUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child as uid 65534")
	}
	cfg := DefaultConfig()
	cfg.AllowUIDs = []uint32{65534}
	d := openDevice(t, &cfg)
	mine := alloc(t, d, 4096)
	theirs, err := d.AllocFor(4096, 65534)
	if err != nil {
		t.Fatal(err)
	}
	mineMR := register(t, d, mine, AccessLocalWrite|AccessRemoteWrite)
	theirsMR := register(t, d, theirs, AccessLocalWrite|AccessRemoteWrite)
	ln, err := d.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	child := testutil.StartChildAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "scoped", nil, ln.Addr().String())
	qp, err := ln.Accept(QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ()})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	var msg [32]byte
	le := binary.LittleEndian
	le.PutUint64(msg[0:], uint64(theirsMR.Addr))
	le.PutUint64(msg[8:], theirsMR.RKey)
	le.PutUint64(msg[16:], uint64(mineMR.Addr))
	le.PutUint64(msg[24:], mineMR.RKey)
	if err := qp.PostSend(SendWR{Op: OpSend, Local: msg[:], Unsignaled: true}); err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(theirs[:20], []byte("written by uid 65534")) {
		t.Errorf("memory for the child's uid holds %q", theirs[:20])
	}
	if !bytes.Equal(mine, make([]byte, len(mine))) {
		t.Error("memory for our own uid was written")
	}
}

// TestPeerSegmentAnnouncementsBounded: a peer that announces more memory
// segments than maxPeerSegments (here with SEG_DENY, 8 bytes apiece) fails
// its queue pair with a protocol error instead of growing our memory.
func TestPeerSegmentAnnouncementsBounded(t *testing.T) {
	a, b := pair(t, nil, nil)
	idx := make([]uint32, maxPeerSegments+1)
	for i := range idx {
		idx[i] = uint32(1000 + i)
	}
	sendCM(t, a, cmSegDeny, idx...)
	awaitProtocolError(t, b, "memory segments announced")
	b.qp.peer.segMu.Lock()
	n := len(b.qp.peer.segs)
	b.qp.peer.segMu.Unlock()
	if n > maxPeerSegments {
		t.Fatalf("%d segments recorded, want at most %d", n, maxPeerSegments)
	}
}
