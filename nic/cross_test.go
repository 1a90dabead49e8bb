package nic

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// The target child: listens on args[0], accepts one queue pair, exposes a
// region of args[2] bytes (device memory if args[1] is "segment", Go memory
// otherwise) for remote read and write, filled with a pattern, and tells
// the dialer where it is in one send: addr u64 | rkey u64 | len u64. Then
// it echoes every message it receives until the queue pair fails.
func init() {
	testutil.RegisterChild("target", func(args []string) error {
		size, err := strconv.Atoi(args[2])
		if err != nil {
			return err
		}
		cfg := DefaultConfig()
		cfg.NoRDMARead = args[3] != "read"
		d, err := Open(&cfg)
		if err != nil {
			return err
		}
		defer d.Close()
		ln, err := d.Listen(args[0])
		if err != nil {
			return err
		}
		fmt.Println("listening")
		scq, rcq := d.NewCQ(), d.NewCQ()
		qp, err := ln.Accept(QPOptions{SendCQ: scq, RecvCQ: rcq})
		ln.Close()
		if err != nil {
			return err
		}
		var target []byte
		if args[1] == "segment" {
			if target, err = d.Alloc(size); err != nil {
				return err
			}
		} else {
			target = make([]byte, size)
		}
		for i := range target {
			target[i] = byte(i % 251)
		}
		mr, err := d.RegisterRemote(target, AccessRemoteRead|AccessRemoteWrite|AccessLocalWrite)
		if err != nil {
			return err
		}
		var desc [24]byte
		binary.LittleEndian.PutUint64(desc[0:], uint64(mr.Addr))
		binary.LittleEndian.PutUint64(desc[8:], mr.RKey)
		binary.LittleEndian.PutUint64(desc[16:], uint64(mr.Len))
		if err := qp.PostSend(SendWR{Op: OpSend, Local: desc[:]}); err != nil {
			return err
		}
		buf := make([]byte, d.Attr().MaxSend)
		bmr, err := d.Register(buf, AccessLocalWrite)
		if err != nil {
			return err
		}
		var c [4]Completion
		for {
			if err := qp.PostRecv(RecvWR{Buf: buf, LKey: bmr.LKey}); err != nil {
				return nil // the dialer went away
			}
			n, err := rcq.Wait(c[:1], time.Time{})
			if err != nil || n != 1 || c[0].Status != StatusSuccess {
				return nil
			}
			if err := qp.PostSend(SendWR{Op: OpSend, Local: buf[:c[0].Bytes], LKey: bmr.LKey}); err != nil {
				return nil
			}
			scq.Poll(c[:])
		}
	})
}

// dialTarget starts a target child and connects to it.
func dialTarget(t *testing.T, mem string, size int, read bool) (*end, *testutil.Child, uint64, uint64) {
	t.Helper()
	addr := testAddr()
	mode := "noread"
	if read {
		mode = "read"
	}
	child := testutil.StartChild(t, "target", nil, addr, mem, strconv.Itoa(size), mode)
	e := &end{d: openDevice(t, nil)}
	e.scq, e.rcq = e.d.NewCQ(), e.d.NewCQ()
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.qp, err = e.d.Dial(addr, QPOptions{SendCQ: e.scq, RecvCQ: e.rcq})
		if err == nil || time.Now().After(deadline) {
			break
		}
		select { // the child is not listening yet: wait for it, or its exit
		case <-child.Done():
			t.Fatalf("child exited: %s", child.Output())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err != nil {
		t.Fatalf("dial: %v\n%s", err, child.Output())
	}
	t.Cleanup(func() { e.qp.Close() })
	if e.qp.PeerAttr().RDMARead != read {
		t.Fatalf("peer RDMARead %v", e.qp.PeerAttr().RDMARead)
	}
	desc := make([]byte, 24)
	mr := register(t, e.d, desc, AccessLocalWrite)
	if err := e.qp.PostRecv(RecvWR{Buf: desc, LKey: mr.LKey}); err != nil {
		t.Fatal(err)
	}
	if c := wait(t, e.rcq); c.Status != StatusSuccess || c.Bytes != 24 {
		t.Fatalf("descriptor: %+v\n%s", c, child.Output())
	}
	e.d.Deregister(mr)
	return e, child, binary.LittleEndian.Uint64(desc), binary.LittleEndian.Uint64(desc[8:])
}

func TestAcrossProcesses(t *testing.T) {
	for _, mem := range []string{"segment", "cma"} {
		for _, read := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/read=%v", mem, read), func(t *testing.T) {
				const size = 1 << 20
				e, child, addr, rkey := dialTarget(t, mem, size, read)
				// Read the pattern back, then write ours and read it back.
				buf := make([]byte, size)
				mr := register(t, e.d, buf, AccessLocalWrite)
				post := func(op Opcode) {
					t.Helper()
					if err := e.qp.PostSend(SendWR{Op: op, Local: buf, LKey: mr.LKey, Remote: addr, RKey: rkey}); err != nil {
						t.Fatal(err)
					}
					if c := wait(t, e.scq); c.Status != StatusSuccess || c.Bytes != size {
						t.Fatalf("%v: %+v", op, c)
					}
				}
				post(OpRead)
				for i, b := range buf {
					if b != byte(i%251) {
						t.Fatalf("byte %d read %d", i, b)
					}
				}
				for i := range buf {
					buf[i] = byte(i % 239)
				}
				post(OpWrite)
				clear(buf)
				post(OpRead)
				for i, b := range buf {
					if b != byte(i%239) {
						t.Fatalf("byte %d read back %d", i, b)
					}
				}
				// Sends echo.
				msg := []byte("ping across processes")
				echo := make([]byte, 64)
				emr := register(t, e.d, echo, AccessLocalWrite)
				e.qp.PostRecv(RecvWR{ID: 3, Buf: echo, LKey: emr.LKey})
				e.qp.PostSend(SendWR{Op: OpSend, Local: msg})
				if c := wait(t, e.rcq); c.Status != StatusSuccess || !bytes.Equal(echo[:c.Bytes], msg) {
					t.Fatalf("echo %+v %q", c, echo)
				}
				e.qp.Close()
				if err := child.Wait(10 * time.Second); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestPeerKilled kills the target in the middle of a long RDMA transfer:
// the transfer and everything queued behind it complete with an error
// within the bound, and nothing leaks (TestMain checks fds and mappings).
func TestPeerKilled(t *testing.T) {
	for _, mem := range []string{"segment", "cma"} {
		t.Run(mem, func(t *testing.T) {
			const size = 64 << 20
			lockedBefore := vmLocked(t)
			e, child, addr, rkey := dialTarget(t, mem, size, true)
			buf := make([]byte, size)
			mr := register(t, e.d, buf, AccessLocalWrite)
			// Work in flight all the time, from before the kill until the
			// queue pair fails: how long a dying process takes to hang up
			// varies (its exit detaches eBPF links, which waits for RCU
			// grace periods), and a transfer must be under way then.
			const inFlight = 8
			// post tells whether the write was posted: one refused because
			// the queue pair failed between the caller's look at its state
			// and the post completes nothing, and must not be waited for.
			post := func(id uint64) bool {
				err := e.qp.PostSend(SendWR{ID: id, Op: OpWrite, Local: buf, LKey: mr.LKey, Remote: addr, RKey: rkey})
				if err != nil && e.qp.State() == QPReady {
					t.Fatal(err)
				}
				return err == nil
			}
			for i := range inFlight {
				if !post(uint64(i)) {
					t.Fatal("a write refused before the kill")
				}
			}
			wait(t, e.scq) // the first transfer finished: the engine is busy with the rest
			if !post(inFlight) {
				t.Fatal("a write refused before the kill")
			}
			child.Kill()
			exited := make(chan time.Time, 1)
			go func() { <-child.Done(); exited <- time.Now() }()
			var failed int
			var killed time.Time
			for pending, next := inFlight, uint64(inFlight+1); pending > 0; pending-- {
				c := wait(t, e.scq)
				if c.Status != StatusSuccess {
					failed++
					if c.Status != StatusFlushed && c.Status != StatusRemoteOp {
						t.Fatalf("completion %+v", c)
					}
				} else if failed == 0 && e.qp.State() == QPReady && post(next) {
					// The queue stays full until the failure.
					next++
					pending++
				}
			}
			select {
			case killed = <-exited:
			case <-time.After(10 * time.Second):
				t.Fatal("the killed peer did not exit")
			}
			elapsed := time.Since(killed)
			t.Logf("%d transfers failed; all completed %v after the peer exited", failed, elapsed)
			if failed == 0 {
				t.Fatal("no transfer failed after the peer was killed")
			}
			// The goal is milliseconds (the elapsed time is logged); the
			// test fails only on what is clearly a hang, so that a loaded
			// machine does not make it flaky.
			if elapsed > 5*time.Second {
				t.Errorf("completions took %v after the kill", elapsed)
			}
			if !errors.Is(e.qp.Err(), ErrPeerGone) && e.qp.State() != QPError {
				t.Fatalf("QP state %v, %v", e.qp.State(), e.qp.Err())
			}
			// Pinned memory returns to its baseline once the survivor lets
			// go (the kernel's count, not ours); fds and mappings are
			// checked by TestMain.
			e.d.Deregister(mr)
			e.qp.Close()
			e.d.Close()
			// (Earlier tests' memory may still be unlocking: less is fine.)
			if after := vmLocked(t); after > lockedBefore {
				t.Fatalf("locked memory %d kB before, %d kB after", lockedBefore, after)
			}
		})
	}
}

func init() {
	testutil.RegisterChild("dialer", func(args []string) error {
		d, err := Open(nil)
		if err != nil {
			return err
		}
		defer d.Close()
		_, err = d.Dial(args[0], QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ()})
		if err == nil {
			return errors.New("connected")
		}
		if !errors.Is(err, ErrRefused) {
			return fmt.Errorf("dial: %w, want ErrRefused", err)
		}
		return nil
	})
}

func TestOtherUIDRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child as uid 65534")
	}
	d := openDevice(t, nil)
	ln, err := d.Listen(testAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	child := testutil.StartChildAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "dialer", nil, ln.Addr().String())
	_, err = ln.Accept(QPOptions{SendCQ: d.NewCQ(), RecvCQ: d.NewCQ()})
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("Accept: %v, want ErrRefused", err)
	}
	if err := child.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// vmLocked returns the process's locked memory in kB (VmLck).
func vmLocked(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmLck:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return 0
}
