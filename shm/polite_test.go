package shm

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// politeWordOff is where the cpuwaker child stores its mark.
const politeWordOff = SegmentHeaderSize

func init() {
	// cpuwaker pins its thread to CPU args[0], says so on fd 5, sleeps
	// in a blocking read of fd 4, and once woken stores 1 in the segment
	// on fd 3 (politeWordOff).
	testutil.RegisterChild("cpuwaker", func(args []string) error {
		cpu, err := strconv.Atoi(args[0])
		if err != nil {
			return err
		}
		s, err := OpenSegment(3, KindRings, politeWordOff+8)
		if err != nil {
			return err
		}
		defer s.Close()
		runtime.LockOSThread()
		if _, err := sys.PinThread(cpu); err != nil {
			return err
		}
		if _, err := syscall.Write(5, []byte("pinned\n")); err != nil {
			return err
		}
		var b [1]byte
		for {
			_, err := syscall.Read(4, b[:]) // blocking: this thread sleeps
			if err != syscall.EINTR {
				if err != nil {
					return err
				}
				break
			}
		}
		StoreUint64(s.Bytes(), politeWordOff, 1)
		return nil
	})
}

// TestPoliteSpinYieldsTheCPU: a thread of another process woken onto a
// polite spinner's CPU runs within a few of the spin's yields, not when
// the kernel gets round to preempting the spinner: the child's thread
// and this test's are pinned to the same CPU, the test wakes the child
// and spins politely for the mark the child then stores, and counts its
// looks. It fails with the polite yield taken out (checked: the child
// ran only after the spin's end, tens of thousands of looks).
func TestPoliteSpinYieldsTheCPU(t *testing.T) {
	cpus, err := sys.AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	cpu := cpus[0]
	seg := newSegment(t, politeWordOff+8)
	f, err := seg.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wakeR, wakeW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer wakeW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer readyR.Close()
	child := testutil.StartChild(t, "cpuwaker", []*os.File{f, wakeR, readyW}, strconv.Itoa(cpu))
	wakeR.Close()
	readyW.Close()
	readyR.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := bufio.NewReader(readyR).ReadString('\n'); err != nil {
		t.Fatalf("child not pinned: %v; output:\n%s", err, child.Output())
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	restore, err := sys.PinThread(cpu)
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	const spin = 2 * time.Second
	s := NewWaitStrategy(WaitConfig{Mode: WaitAdaptive, Spin: spin})
	for range 40 {
		s.learn(spin / 2) // long waits: the next one spins politely
	}
	looks := 0
	mem := seg.Bytes()
	x := readyFunc(func() bool { looks++; return LoadUint64(mem, politeWordOff) != 0 })
	if _, err := wakeW.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	o, err := s.Wait(x, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(20 * time.Second); err != nil {
		t.Fatalf("child: %v; output:\n%s", err, child.Output())
	}
	// Yields come every politeEvery clock looks; the child may need a
	// few (the kernel may run another thread first).
	if limit := 16 * politeEvery * SpinCheckEvery; o == WaitedSlept || looks > limit {
		t.Fatalf("the child woken onto the spinner's CPU ran after %d looks (%v, %d polite yields), want at most %d",
			looks, o, s.politeYields, limit)
	}
}
