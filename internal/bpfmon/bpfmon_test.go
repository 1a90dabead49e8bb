package bpfmon

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.RegisterChild("munmapper", childMunmapper)
	testutil.RegisterChild("open-unprivileged", childOpenUnprivileged)
	testutil.RegisterChild("pidns-monitor", childPidnsMonitor)
	testutil.RegisterChild("getppid-loop", childGetppidLoop)
	testutil.Main(m)
}

// envRequire names the attach methods that must work: a comma-separated
// list, or "all". Where it names a method, a test that would skip because the
// method is missing fails instead (CI sets it where the kernel is known).
const envRequire = "SANDIRECT_REQUIRE_EBPF"

func required(meth Method) bool {
	v := os.Getenv(envRequire)
	return v == "all" || slices.Contains(strings.Split(v, ","), string(meth))
}

var page = uintptr(os.Getpagesize())

// openMethod opens a Monitor attached with meth alone, skipping the test
// with the missing feature's name when the method cannot run here (failing
// when envRequire names it). The Monitor is closed at the end of the test.
func openMethod(t testing.TB, meth Method, cfg Config) *Monitor {
	t.Helper()
	cfg.Methods = []Method{meth}
	m, err := Open(&cfg)
	if errors.Is(err, ErrNotSupported) {
		if required(meth) {
			t.Fatalf("%s required (%s=%s) but: %v", meth, envRequire, os.Getenv(envRequire), err)
		}
		t.Skipf("skip: %v", err)
	}
	if err != nil {
		t.Fatalf("Open(%s): %v", meth, err)
	}
	if m.Method() != meth {
		t.Fatalf("Open with only %s attached %s", meth, m.Method())
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// forEachMethod runs f as a subtest per attach method.
func forEachMethod(t *testing.T, cfg Config, f func(t *testing.T, m *Monitor)) {
	for _, meth := range Methods() {
		t.Run("method="+string(meth), func(t *testing.T) {
			f(t, openMethod(t, meth, cfg))
		})
	}
}

// want is an expected event, without the fields a test cannot know.
type want struct {
	sc     Syscall
	start  uintptr
	length uintptr
	arg    uint32
	dest   bool
}

func (w want) String() string {
	return fmt.Sprintf("%s [%#x, +%#x) arg %#x dest %v", w.sc, w.start, w.length, w.arg, w.dest)
}

// syncEvents brings the test up to date and returns the events from thread
// tid that overlap [lo, hi).
func syncEvents(t *testing.T, m *Monitor, tid int, lo, hi uintptr) []want {
	t.Helper()
	var got []want
	_, err := m.Sync(func(e Event) {
		if int(e.Tid) == tid && e.Start < hi && e.Start+e.Length > lo {
			got = append(got, want{e.Syscall, e.Start, e.Length, e.Arg, e.Dest})
		}
	}, nil)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return got
}

func mapAnon(t *testing.T, length uintptr) uintptr {
	t.Helper()
	a, err := sys.MmapAnon(0, length, 0)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	return a
}

func check(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestEvents checks that each reported call produces exactly the events for
// the ranges it touches, and calls that touch nothing produce none, on every
// attach method, with the granule filter (Watch) doing the selecting.
func TestEvents(t *testing.T) {
	const (
		mapPrivAnon  = 0x02 | 0x20 // MAP_PRIVATE | MAP_ANONYMOUS
		madvWillneed = 3
	)
	type tcase struct {
		name string
		// run performs the calls on [lo, hi) (which it may create) and
		// returns the region to look at and the events expected there.
		run func(t *testing.T, m *Monitor) (lo, hi uintptr, w []want)
	}
	cases := []tcase{
		{"munmap", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			b, err := sys.MapAnon(int(4 * page))
			check(t, "MapAnon", err)
			a := sys.Addr(b)
			check(t, "Watch", m.Watch(a, 4*page))
			check(t, "Munmap", sys.Munmap(b))
			return a, a + 4*page, []want{{Munmap, a, 4 * page, 0, false}}
		}},
		{"munmap-partial-unaligned-length", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			a := mapAnon(t, 4*page)
			check(t, "Watch", m.Watch(a, 4*page))
			check(t, "munmap", sys.MunmapRange(a+page, page+1)) // rounds up to two pages
			check(t, "munmap rest", sys.MunmapRange(a, page))
			check(t, "munmap rest", sys.MunmapRange(a+3*page, page))
			return a, a + 4*page, []want{
				{Munmap, a + page, 2 * page, 0, false},
				{Munmap, a, page, 0, false},
				{Munmap, a + 3*page, page, 0, false},
			}
		}},
		{"mremap-shrink", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			a := mapAnon(t, 4*page)
			check(t, "Watch", m.Watch(a, 4*page))
			na, err := sys.Mremap(a, 4*page, 2*page, 0, 0)
			check(t, "mremap", err)
			if na != a {
				t.Fatalf("mremap without MAYMOVE moved %#x to %#x", a, na)
			}
			check(t, "munmap", sys.MunmapRange(a, 2*page))
			return a, a + 4*page, []want{
				{Mremap, a, 4 * page, 0, false},
				{Munmap, a, 2 * page, 0, false},
			}
		}},
		{"mremap-grow-in-place", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			a := mapAnon(t, 4*page)
			check(t, "munmap tail", sys.MunmapRange(a+2*page, 2*page))
			check(t, "Watch", m.Watch(a, 4*page))
			_, err := sys.Mremap(a, 2*page, 4*page, 0, 0)
			if err != nil {
				t.Skipf("no room to grow in place: %v", err)
			}
			check(t, "munmap", sys.MunmapRange(a, 4*page))
			return a, a + 4*page, []want{
				{Mremap, a, 2 * page, 0, false},
				{Munmap, a, 4 * page, 0, false},
			}
		}},
		{"mremap-move-fixed", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			// One mapping of 8 pages: source the first 2, destination 4..7.
			a := mapAnon(t, 8*page)
			src, dst := a, a+4*page
			check(t, "Watch", m.Watch(a, 8*page))
			const flags = sys.MremapMaymove | sys.MremapFixed
			na, err := sys.Mremap(src, 2*page, 3*page, flags, dst)
			check(t, "mremap", err)
			if na != dst {
				t.Fatalf("mremap FIXED to %#x went to %#x", dst, na)
			}
			check(t, "munmap", sys.MunmapRange(a, 8*page))
			return a, a + 8*page, []want{
				{Mremap, src, 2 * page, flags, false},
				{Mremap, dst, 3 * page, flags, true},
				{Munmap, a, 8 * page, 0, false},
			}
		}},
		{"madvise", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			// A shared memfd mapping, so that MADV_REMOVE succeeds too.
			fd, err := sys.MemfdCreate("bpfmon-test")
			check(t, "memfd", err)
			defer sys.Close(fd)
			check(t, "ftruncate", sys.Ftruncate(fd, int64(8*page)))
			b, err := sys.MapShared(fd, int(8*page), true)
			check(t, "mmap", err)
			a := sys.Addr(b)
			check(t, "Watch", m.Watch(a, 8*page))
			var w []want
			for i, adv := range []int{sys.MadvDontneed, sys.MadvFree, sys.MadvRemove, sys.MadvDontneedLocked, 102 /* MADV_GUARD_INSTALL */} {
				// Failing calls (MADV_FREE on shared memory,
				// GUARD_INSTALL before 6.13) are reported too: at entry.
				sys.Madvise(a+uintptr(i)*page, page, adv)
				w = append(w, want{Madvise, a + uintptr(i)*page, page, uint32(adv), false})
			}
			check(t, "madvise WILLNEED", sys.Madvise(a, 8*page, madvWillneed))
			check(t, "madvise DONTFORK", sys.Madvise(a, 8*page, sys.MadvDontfork))
			check(t, "munmap", sys.Munmap(b))
			w = append(w, want{Munmap, a, 8 * page, 0, false})
			return a, a + 8*page, w
		}},
		{"mmap-fixed", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			a := mapAnon(t, 8*page)
			check(t, "Watch", m.Watch(a, 8*page))
			_, err := sys.MmapAnon(a+page, 2*page, sys.MapFixed)
			check(t, "mmap MAP_FIXED", err)
			// Onto a hole: NOREPLACE succeeds without replacing anything;
			// onto a mapping it fails. Neither is reported; nor is a hint.
			check(t, "munmap hole", sys.MunmapRange(a+5*page, page))
			_, err = sys.MmapAnon(a+5*page, page, sys.MapFixedNoreplace)
			check(t, "mmap MAP_FIXED_NOREPLACE", err)
			if _, err := sys.MmapAnon(a+6*page, page, sys.MapFixedNoreplace); err == nil {
				t.Fatalf("MAP_FIXED_NOREPLACE over a mapping succeeded")
			}
			h, err := sys.MmapAnon(a+page, page, 0)
			check(t, "mmap hint", err)
			check(t, "munmap", sys.MunmapRange(a, 8*page))
			w := []want{
				{Mmap, a + page, 2 * page, mapPrivAnon | sys.MapFixed, false},
				{Munmap, a + 5*page, page, 0, false},
				{Munmap, a, 8 * page, 0, false},
			}
			if h < a || h >= a+8*page {
				sys.MunmapRange(h, page)
			}
			return a, a + 8*page, w
		}},
		{"shmdt", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			size := 3*page + 100
			id, err := sys.ShmGet(int(size))
			check(t, "shmget", err)
			a, err := sys.ShmAt(id, 0)
			if err != nil {
				sys.ShmRemove(id)
				t.Fatalf("shmat: %v", err)
			}
			check(t, "IPC_RMID", sys.ShmRemove(id))
			check(t, "Watch", m.Watch(a, 4*page))
			check(t, "shmdt", sys.ShmDt(a))
			if err := sys.ShmDt(a + page); err == nil { // nothing attached there: no event
				t.Fatalf("shmdt of a non-attachment succeeded")
			}
			return a, a + 4*page, []want{{Shmdt, a, 4 * page, 0, false}}
		}},
		{"brk-shrink", func(t *testing.T, m *Monitor) (uintptr, uintptr, []want) {
			cur := sys.Brk(0)
			up := func(x uintptr) uintptr { return (x + page - 1) &^ (page - 1) }
			if got := sys.Brk(cur + 3*page); got != cur+3*page {
				t.Skipf("brk cannot grow here: brk(%#x) = %#x", cur+3*page, got)
			}
			lo, hi := up(cur), up(cur+3*page)
			check(t, "Watch", m.Watch(lo, hi-lo))
			if got := sys.Brk(cur); got != cur {
				t.Fatalf("brk(%#x) = %#x", cur, got)
			}
			sys.Brk(0)
			sys.Brk(cur) // no change: nothing
			return lo, hi, []want{{Brk, lo, hi - lo, 0, false}}
		}},
	}
	forEachMethod(t, Config{}, func(t *testing.T, m *Monitor) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				tid := sys.Gettid()
				syncEvents(t, m, -1, 0, 0)
				lo, hi, w := tc.run(t, m)
				t.Cleanup(func() { m.Unwatch(lo, hi-lo) })
				got := syncEvents(t, m, tid, lo, hi)
				if tc.name == "shmdt" && len(got) == 1 && got[0].length == ^lo+1 {
					t.Logf("shmdt length unknown on this kernel (no bpf_find_vma)")
					w[0].length = got[0].length
				}
				if !slices.Equal(got, w) {
					t.Errorf("events in [%#x, %#x):\n got %v\nwant %v", lo, hi, got, w)
				}
			})
		}
	})
}

// TestUnwatchedAndQueries checks that nothing is reported for unwatched
// granules (and the epoch does not move for them), that brk(0) is silent even
// with WatchAll, and that Unwatch stops reporting.
func TestUnwatchedAndQueries(t *testing.T) {
	forEachMethod(t, Config{}, func(t *testing.T, m *Monitor) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid := sys.Gettid()

		a := mapAnon(t, 4*page)
		check(t, "munmap", sys.MunmapRange(a, 4*page))
		if got := syncEvents(t, m, tid, a, a+4*page); len(got) != 0 {
			t.Errorf("unwatched munmap reported: %v", got)
		}

		a = mapAnon(t, 4*page)
		check(t, "Watch", m.Watch(a, page))
		check(t, "Watch", m.Watch(a, page)) // two references
		check(t, "Unwatch", m.Unwatch(a, page))
		check(t, "madvise", sys.Madvise(a, page, sys.MadvDontneed))
		if got := syncEvents(t, m, tid, a, a+4*page); len(got) != 1 {
			t.Errorf("madvise with one Watch reference left: %v", got)
		}
		check(t, "Unwatch", m.Unwatch(a, page))
		check(t, "munmap", sys.MunmapRange(a, 4*page))
		if got := syncEvents(t, m, tid, a, a+4*page); len(got) != 0 {
			t.Errorf("munmap after Unwatch reported: %v", got)
		}

		m.WatchAll(true)
		defer m.WatchAll(false)
		for range 100 {
			sys.Brk(0)
		}
		var brks []Event
		if _, err := m.Sync(func(e Event) {
			if e.Syscall == Brk && int(e.Tid) == tid {
				brks = append(brks, e)
			}
		}, nil); err != nil {
			t.Fatal(err)
		}
		if len(brks) != 0 {
			t.Errorf("brk(0) reported: %v", brks)
		}
	})
}

// TestEpochSynchronous checks the property the cache relies on: once munmap
// has returned, in this thread or another, the epoch has moved; and Sync
// then hands over the event carrying that epoch.
func TestEpochSynchronous(t *testing.T) {
	forEachMethod(t, Config{}, func(t *testing.T, m *Monitor) {
		const rounds = 2000
		for i := range rounds {
			a := mapAnon(t, 16*page)
			check(t, "Watch", m.Watch(a, 16*page))
			before := m.Epoch()
			done := make(chan struct{})
			if i%2 == 0 {
				check(t, "munmap", sys.MunmapRange(a, 16*page))
				close(done)
			} else {
				go func() { // another goroutine, usually another thread
					sys.MunmapRange(a, 16*page)
					close(done)
				}()
			}
			<-done
			after := m.Epoch()
			if after == before {
				t.Fatalf("round %d: epoch %d did not move across munmap", i, before)
			}
			var found bool
			e, err := m.Sync(func(ev Event) {
				if ev.Syscall == Munmap && ev.Start == a {
					found = true
					if ev.Epoch <= before || ev.Epoch > after {
						t.Errorf("event epoch %d outside (%d, %d]", ev.Epoch, before, after)
					}
				}
			}, nil)
			check(t, "Sync", err)
			if !found || e < after || m.Synced() < after {
				t.Fatalf("round %d: Sync found event %v, returned %d, Synced %d; epoch was %d", i, found, e, m.Synced(), after)
			}
			check(t, "Unwatch", m.Unwatch(a, 16*page))
		}
	})
}

// TestOverflow fills a one-page ring without draining: the overflow word is
// set, every lost event still moved the epoch, and Sync flushes.
func TestOverflow(t *testing.T) {
	forEachMethod(t, Config{RingSize: int(page)}, func(t *testing.T, m *Monitor) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		a := mapAnon(t, page)
		defer sys.MunmapRange(a, page)
		check(t, "Watch", m.Watch(a, page))
		if _, err := m.Sync(func(Event) {}, nil); err != nil {
			t.Fatal(err)
		}
		m.ClearOverflow()
		const calls = 1000 // a page holds 85 events
		before := m.Epoch()
		for range calls {
			sys.Madvise(a, page, sys.MadvDontneed)
		}
		if !m.Overflowed() {
			t.Fatalf("no overflow after %d events into a %d-byte ring", calls, page)
		}
		// Every increment of the epoch is one event delivered or lost.
		// Another thread may touch the granule too (the runtime, a
		// finalizer): then the accounting is checked loosely.
		moved := m.Epoch() - before
		lost := m.ClearOverflow()
		if m.Overflowed() {
			t.Errorf("overflow still set after ClearOverflow")
		}
		var got, all uint64
		_, err := m.Drain(func(e Event) {
			all++
			if e.Start == a && e.Syscall == Madvise && int(e.Tid) == sys.Gettid() {
				got++
			}
		})
		check(t, "Drain", err)
		if moved < calls || got+lost < calls || lost == 0 || all == got && all+lost != moved {
			t.Errorf("epoch moved %d for %d calls: drained %d (%d ours), lost %d", moved, calls, all, got, lost)
		}
		t.Logf("%d-byte ring: %d events delivered, %d lost", page, got, lost)

		// Sync calls flush after a loss, and only then.
		for range calls {
			sys.Madvise(a, page, sys.MadvDontneed)
		}
		flushed := 0
		e, err := m.Sync(func(Event) {}, func() { flushed++ })
		check(t, "Sync", err)
		if flushed != 1 || m.Synced() != e || e < before+2*calls {
			t.Errorf("after a loss: flushed %d times, Sync %d, Synced %d", flushed, e, m.Synced())
		}
		if _, err := m.Sync(func(Event) {}, func() { flushed++ }); err != nil || flushed != 1 {
			t.Errorf("Sync without loss flushed (%d) or failed: %v", flushed, err)
		}
	})
}

// childMunmapper maps and unmaps 64 KiB each time a line arrives on fd 3,
// and answers with the address on fd 4.
func childMunmapper([]string) error {
	in := bufio.NewScanner(os.NewFile(3, "cmd"))
	out := os.NewFile(4, "reply")
	for in.Scan() {
		a, err := sys.MmapAnon(0, 16*page, 0)
		if err != nil {
			return err
		}
		if err := sys.MunmapRange(a, 16*page); err != nil {
			return err
		}
		fmt.Fprintf(out, "%d %d\n", a, sys.Gettid())
	}
	return in.Err()
}

// TestOtherProcesses checks the process filter: a process not added is not
// reported, even with WatchAll; added, it is, alongside this one; removed,
// it is not again.
func TestOtherProcesses(t *testing.T) {
	forEachMethod(t, Config{}, func(t *testing.T, m *Monitor) {
		cmdR, cmdW, err := os.Pipe()
		check(t, "pipe", err)
		repR, repW, err := os.Pipe()
		check(t, "pipe", err)
		child := testutil.StartChild(t, "munmapper", []*os.File{cmdR, repW})
		cmdR.Close()
		repW.Close()
		defer repR.Close()
		replies := bufio.NewScanner(repR)
		round := func() (addr uintptr, tid int) {
			t.Helper()
			fmt.Fprintln(cmdW, "go")
			if !replies.Scan() {
				t.Fatalf("child gave no reply: %v\n%s", replies.Err(), child.Output())
			}
			f := strings.Fields(replies.Text())
			a, _ := strconv.ParseUint(f[0], 10, 64)
			tid, _ = strconv.Atoi(f[1])
			return uintptr(a), tid
		}
		count := func(addr uintptr) (n int) {
			_, err := m.Sync(func(e Event) {
				if e.Syscall == Munmap && e.Start == addr {
					n++
				}
			}, nil)
			check(t, "Sync", err)
			return n
		}
		m.WatchAll(true)
		defer m.WatchAll(false)

		a, _ := round()
		if n := count(a); n != 0 {
			t.Errorf("munmap of a process not watched reported %d times", n)
		}
		pid := child.Cmd.Process.Pid
		check(t, "AddPid", m.AddPid(pid))
		a, ctid := round()
		var got []Event
		_, err = m.Sync(func(e Event) {
			if e.Start == a {
				got = append(got, e)
			}
		}, nil)
		check(t, "Sync", err)
		if len(got) != 1 || got[0].Syscall != Munmap || int(got[0].Tid) != ctid {
			t.Errorf("watched child (pid %d, tid %d): events %v", pid, ctid, got)
		}
		// This process is still watched too.
		own := mapAnon(t, page)
		check(t, "munmap", sys.MunmapRange(own, page))
		if n := count(own); n != 1 {
			t.Errorf("own munmap reported %d times with a child watched too", n)
		}
		check(t, "RemovePid", m.RemovePid(pid))
		a, _ = round()
		if n := count(a); n != 0 {
			t.Errorf("munmap of a removed process reported %d times", n)
		}
		cmdW.Close()
		if err := child.Wait(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

func childOpenUnprivileged([]string) error {
	m, err := Open(nil)
	if err == nil {
		m.Close()
		return errors.New("Open succeeded without privileges")
	}
	if !errors.Is(err, ErrNotSupported) {
		return fmt.Errorf("Open: %v does not match ErrNotSupported", err)
	}
	fmt.Println(err)
	return nil
}

// TestUnprivileged checks that an unprivileged process gets ErrNotSupported
// naming the missing capability.
func TestUnprivileged(t *testing.T) {
	if sys.Geteuid() != 0 {
		t.Skip("skip: needs root to start an unprivileged child")
	}
	c := testutil.StartChildAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "open-unprivileged", nil)
	if err := c.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	out := c.Output()
	t.Logf("unprivileged Open: %s", strings.TrimSpace(out))
	if !strings.Contains(out, "CAP_BPF") && !strings.Contains(out, "bpf(2)") {
		t.Errorf("error does not name the missing capability: %s", out)
	}
	if strings.Contains(out, "CAP_BPF") && strings.Contains(out, "MEMLOCK") {
		t.Errorf("error blames RLIMIT_MEMLOCK for a missing capability: %s", out)
	}
}

// TestDefaultOpen checks the default method order: the first method that
// works here runs, and the reasons name every method tried before it.
func TestDefaultOpen(t *testing.T) {
	m, err := Open(nil)
	if errors.Is(err, ErrNotSupported) && os.Getenv(envRequire) == "" {
		t.Skipf("skip: %v", err)
	}
	check(t, "Open", err)
	defer m.Close()
	i := slices.Index(Methods(), m.Method())
	if i < 0 || len(m.Reasons()) != i {
		t.Errorf("method %s with reasons %q", m.Method(), m.Reasons())
	}
	t.Logf("kernel %s: %s; %q", sys.KernelRelease(), m.Method(), m.Reasons())
}

// TestClose checks what a closed Monitor leaves: a readable epoch word that
// moved, the overflow word set, ErrClosed from every method, a Wait woken.
func TestClose(t *testing.T) {
	m, err := Open(nil)
	if errors.Is(err, ErrNotSupported) && os.Getenv(envRequire) == "" {
		t.Skipf("skip: %v", err)
	}
	check(t, "Open", err)
	w := m.EpochWord()
	before := m.Epoch()
	waited := make(chan error, 1)
	go func() { waited <- m.Wait(time.Now().Add(time.Minute)) }()
	// Closing while Wait blocks must wake it. (If Close wins the race,
	// Wait returns ErrClosed all the same.)
	check(t, "Close", m.Close())
	if err := <-waited; !errors.Is(err, ErrClosed) {
		t.Errorf("Wait across Close: %v", err)
	}
	check(t, "second Close", m.Close())
	if got := m.Epoch(); got != before+1 || *w != got || !m.Overflowed() {
		t.Errorf("after Close: epoch %d (was %d), overflow %v", got, before, m.Overflowed())
	}
	for name, err := range map[string]error{
		"AddPid": m.AddPid(1), "Watch": m.Watch(0x1000, 1), "Wait": m.Wait(time.Time{}),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	if _, err := m.Drain(func(Event) {}); !errors.Is(err, ErrClosed) {
		t.Errorf("Drain after Close: %v", err)
	}
	if _, err := m.Sync(func(Event) {}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Sync after Close: %v", err)
	}
}

// TestWait checks the blocking path: Wait returns when an event arrives, and
// at its deadline when none does.
func TestWait(t *testing.T) {
	m := openMethod(t, RawTracepoint, Config{})
	if _, err := m.Sync(func(Event) {}, nil); err != nil {
		t.Fatal(err)
	}
	a := mapAnon(t, page)
	check(t, "Watch", m.Watch(a, page))
	defer m.Unwatch(a, page)
	done := make(chan error, 1)
	go func() { done <- m.Wait(time.Now().Add(10 * time.Second)) }()
	check(t, "munmap", sys.MunmapRange(a, page))
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if _, err := m.Sync(func(Event) {}, nil); err != nil {
		t.Fatal(err)
	}
	// Nothing watched happens now (unless the runtime touches a watched
	// granule): the deadline passes.
	err := m.Wait(time.Now().Add(20 * time.Millisecond))
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Wait with nothing to come: %v", err)
	}
}

// TestWaitWokenWhileAsleep: the probes wake the ring's readers only while
// one waits (the rest of the time they skip the wake-up, whose self-IPI
// cost most of a munmap's overhead on a VM). A Wait that has announced
// itself is woken by the next event, every time, long before its deadline.
func TestWaitWokenWhileAsleep(t *testing.T) {
	m := openMethod(t, RawTracepoint, Config{})
	for i := range 20 {
		if _, err := m.Sync(func(Event) {}, nil); err != nil {
			t.Fatal(err)
		}
		a := mapAnon(t, page)
		check(t, "Watch", m.Watch(a, page))
		done := make(chan error, 1)
		go func() { done <- m.Wait(time.Now().Add(10 * time.Second)) }()
		for atomic.LoadUint64(m.waiters) == 0 && len(done) == 0 {
			runtime.Gosched() // until the Wait has announced itself (or failed early)
		}
		check(t, "munmap", sys.MunmapRange(a, page))
		if err := <-done; err != nil {
			t.Fatalf("round %d: Wait: %v", i, err)
		}
		m.Unwatch(a, page)
	}
	if n := atomic.LoadUint64(m.waiters); n != 0 {
		t.Fatalf("%d waiters left announced", n)
	}
}

// TestWatchLimits checks the granule accounting and its limit.
func TestWatchLimits(t *testing.T) {
	m := openMethod(t, RawTracepoint, Config{MaxGranules: 4})
	check(t, "Watch", m.Watch(0x40000000, 4<<GranuleShift)) // exactly 4 granules
	if err := m.Watch(0x80000000, 1); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("fifth granule: %v", err)
	}
	check(t, "Watch same", m.Watch(0x40000000+1, 10)) // no new granule
	check(t, "Unwatch", m.Unwatch(0x40000000, 4<<GranuleShift))
	check(t, "Watch", m.Watch(0x80000000, 1))
	if err := m.Watch(0x1000, 0); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("empty range: %v", err)
	}
	if len(m.granuleRefs) != 2 {
		t.Errorf("granule refs %v", m.granuleRefs)
	}
}

// TestDrainAllocs checks that draining allocates nothing per event. The
// lock-rank checker's bookkeeping allocates: under it, it is skipped.
func TestDrainAllocs(t *testing.T) {
	if lockrank.Enabled {
		t.Skip("the lock-rank checker allocates")
	}
	m := openMethod(t, RawTracepoint, Config{})
	a := mapAnon(t, page)
	defer sys.MunmapRange(a, page)
	check(t, "Watch", m.Watch(a, page))
	defer m.Unwatch(a, page)
	var sum uintptr
	fn := func(e Event) { sum += e.Length }
	allocs := testing.AllocsPerRun(100, func() {
		for range 50 {
			sys.Madvise(a, page, sys.MadvDontneed)
		}
		m.Drain(fn)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per 50 drained events", allocs)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{RingSize: 3000}, {RingSize: 3 * int(page)}, {MaxPids: -1}, {Methods: []Method{"fentry"}}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v valid", c)
		}
	}
	if c := (Config{}); c.Validate() != nil {
		t.Errorf("zero Config invalid")
	}
}

// childPidnsMonitor runs in a new pid namespace: it opens its own Monitor
// (its ids there are not the global ones) and checks that its munmap is
// reported, with its thread id as it knows it.
func childPidnsMonitor([]string) error {
	if os.Getpid() != 1 {
		return fmt.Errorf("not in a new pid namespace: pid %d", os.Getpid())
	}
	runtime.LockOSThread()
	m, err := Open(nil)
	if err != nil {
		return err
	}
	defer m.Close()
	a, err := sys.MmapAnon(0, page, 0)
	if err != nil {
		return err
	}
	if err := m.Watch(a, page); err != nil {
		return err
	}
	before := m.Epoch()
	sys.MunmapRange(a, page)
	var got []Event
	if _, err := m.Sync(func(e Event) {
		if e.Start == a {
			got = append(got, e)
		}
	}, nil); err != nil {
		return err
	}
	if m.Epoch() == before || len(got) != 1 || int(got[0].Tid) != sys.Gettid() {
		return fmt.Errorf("in pid namespace (tid %d): epoch %d -> %d, events %v", sys.Gettid(), before, m.Epoch(), got)
	}
	fmt.Printf("pid namespace: %s, event %v\n", m.Method(), got[0])
	return nil
}

// TestPidNamespace checks the monitor in a process of its own pid
// namespace, where the probes must use bpf_get_ns_current_pid_tgid.
func TestPidNamespace(t *testing.T) {
	openMethod(t, RawTracepoint, Config{}) // skips where eBPF cannot run
	c := testutil.StartChildWith(t, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}, "pidns-monitor", nil)
	if err := c.Wait(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Log(strings.TrimSpace(c.Output()))
}

// TestShmdtWithoutFindVma checks the shmdt fallback for kernels before 5.17:
// the length is unknown and the range runs to the top of the address space.
func TestShmdtWithoutFindVma(t *testing.T) {
	testNoFindVma = true
	m := openMethod(t, RawTracepoint, Config{})
	testNoFindVma = false
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	id, err := sys.ShmGet(int(page))
	check(t, "shmget", err)
	a, err := sys.ShmAt(id, 0)
	sys.ShmRemove(id)
	check(t, "shmat", err)
	check(t, "Watch", m.Watch(a, page))
	check(t, "shmdt", sys.ShmDt(a))
	var got []Event
	_, err = m.Sync(func(e Event) {
		if e.Syscall == Shmdt && int(e.Tid) == sys.Gettid() {
			got = append(got, e)
		}
	}, nil)
	check(t, "Sync", err)
	if len(got) != 1 || got[0].Start != a || got[0].Length != -a || !got[0].Unknown {
		t.Errorf("shmdt at %#x without bpf_find_vma: %v", a, got)
	}
}
