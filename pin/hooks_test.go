package pin

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

// fakeNIC records the hook calls; with dropOnRevoke it can revoke only by
// removing the registration.
type fakeNIC struct {
	calls        []string
	dropOnRevoke bool
	nextKey      int
}

func (n *fakeNIC) Register(r *Region) error {
	n.nextKey++
	r.NIC = n.nextKey
	n.calls = append(n.calls, fmt.Sprintf("register:%d", n.nextKey))
	return nil
}

func (n *fakeNIC) Deregister(r *Region) {
	n.calls = append(n.calls, fmt.Sprintf("deregister:%d", r.NIC))
}

func (n *fakeNIC) Expose(r *Region, a Access) error {
	n.calls = append(n.calls, fmt.Sprintf("expose:%d", r.NIC))
	return nil
}

func (n *fakeNIC) Revoke(r *Region) (bool, error) {
	n.calls = append(n.calls, fmt.Sprintf("revoke:%d", r.NIC))
	if n.dropOnRevoke {
		n.calls = append(n.calls, fmt.Sprintf("dropped:%d", r.NIC))
	}
	return n.dropOnRevoke, nil
}

func (n *fakeNIC) Reexpose(r *Region, a Access) error {
	n.calls = append(n.calls, fmt.Sprintf("reexpose:%d", r.NIC))
	return nil
}

func (n *fakeNIC) take() string {
	s := strings.Join(n.calls, " ")
	n.calls = nil
	return s
}

func TestHooks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		drop  bool
		steps []string // after: register, deregister, register, deregister, invalidate
	}{
		{"revoke", false, []string{
			"register:1 expose:1", "revoke:1", "reexpose:1", "revoke:1", "deregister:1",
		}},
		{"revoke-by-drop", true, []string{
			"register:1 expose:1", "revoke:1 dropped:1", "register:2 reexpose:2", "revoke:2 dropped:2", "",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nic := &fakeNIC{dropOnRevoke: tc.drop}
			c := newCache(t, &Config{Monitor: MonitorOwned, Hooks: nic})
			b := allocN(t, 1, 2)[0]
			step := func(i int, what string) {
				t.Helper()
				if got := nic.take(); got != tc.steps[i] {
					t.Errorf("%s: hooks %q, want %q", what, got, tc.steps[i])
				}
			}
			h := register(t, c, b, AccessRemoteWrite)
			step(0, "first register")
			deregister(t, c, h)
			step(1, "deregister")
			wantLocked(t, c, sys.Addr(b), 2, 1) // pages stay locked, cached
			h = register(t, c, b[:100], AccessRemoteWrite)
			step(2, "register again")
			deregister(t, c, h)
			step(3, "deregister again")
			c.Invalidate(sys.Addr(b), uintptr(len(b)))
			step(4, "invalidate")
		})
	}
	t.Run("local-holder-survives-drop", func(t *testing.T) {
		nic := &fakeNIC{dropOnRevoke: true}
		c := newCache(t, &Config{Monitor: MonitorOwned, Hooks: nic})
		b := allocN(t, 1, 1)[0]
		hr := register(t, c, b, AccessRemoteRead)
		hl := register(t, c, b, 0)
		nic.take()
		deregister(t, c, hr) // revoke drops; the local holder needs a registration
		if got, want := nic.take(), "revoke:1 dropped:1 register:2"; got != want {
			t.Errorf("hooks %q, want %q", got, want)
		}
		if k := hl.Region().NIC; k != 2 {
			t.Errorf("local holder's registration key %v, want 2", k)
		}
		deregister(t, c, hl)
	})
	t.Run("in-use-invalidation-revokes", func(t *testing.T) {
		nic := &fakeNIC{}
		c := newCache(t, &Config{Monitor: MonitorOwned, Hooks: nic})
		b := allocN(t, 1, 1)[0]
		h := register(t, c, b, AccessRemoteWrite)
		nic.take()
		c.Invalidate(sys.Addr(b), 1)
		if got := nic.take(); got != "revoke:1" {
			t.Errorf("invalidation of an exposed entry in use: hooks %q, want revoke:1", got)
		}
		deregister(t, c, h)
		if got := nic.take(); got != "deregister:1" {
			t.Errorf("last release: hooks %q, want deregister:1", got)
		}
	})
	t.Run("flush-and-close", func(t *testing.T) {
		nic := &fakeNIC{}
		c := newCache(t, &Config{Monitor: MonitorOwned, Hooks: nic})
		bufs := allocN(t, 2, 1)
		h, _ := c.RegisterFor(7, bufs[0], 0)
		deregister(t, c, h)
		h, _ = c.RegisterFor(8, bufs[1], 0)
		deregister(t, c, h)
		nic.take()
		c.Flush(7)
		if got := nic.take(); got != "deregister:1" {
			t.Errorf("Flush(7): hooks %q", got)
		}
		c.Close()
		if got := nic.take(); got != "deregister:2" {
			t.Errorf("Close: hooks %q", got)
		}
	})
}

type failNIC struct{ fakeNIC }

func (n *failNIC) Register(r *Region) error { return errors.New("nic full") }

func TestHookFailure(t *testing.T) {
	c := newCache(t, &Config{Monitor: MonitorOwned, Hooks: &failNIC{}})
	b := allocN(t, 1, 1)[0]
	if _, err := c.Register(b, 0); err == nil || !strings.Contains(err.Error(), "nic full") {
		t.Fatalf("Register with a failing NIC: %v", err)
	}
	wantLocked(t, c, sys.Addr(b), 1, 0)
	if st := c.Stats(); st.Entries != 0 || st.Failures != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestGoMemory: a cached registration of a Go buffer keeps its object
// alive, so the GC cannot hand its address to another object.
func TestGoMemory(t *testing.T) {
	c := newCache(t, foreignMonitor(t))
	freed := make(chan string, 4)
	reg := func(name string, cached bool) {
		b := make([]byte, 64<<10)
		runtime.AddCleanup(&b[0], func(n string) { freed <- n }, name)
		cc := c
		if !cached {
			cc = newCache(t, &Config{Monitor: MonitorNone})
		}
		h := register(t, cc, b, 0)
		deregister(t, cc, h)
	}
	reg("cached", true)
	reg("control", false)
	wait := func(want string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			runtime.GC()
			select {
			case got := <-freed:
				if got != want {
					t.Fatalf("buffer %q collected, want %q", got, want)
				}
				return
			case <-deadline:
				t.Fatalf("buffer %q never collected", want)
			case <-time.After(time.Millisecond):
			}
		}
	}
	wait("control") // the uncached buffer goes…
	runtime.GC()
	runtime.GC()
	select {
	case got := <-freed: // …the cached one must not
		t.Fatalf("buffer %q collected while its registration is cached", got)
	default:
	}
	if c.Stats().Entries != 1 {
		t.Fatalf("entries %d, want 1", c.Stats().Entries)
	}
	c.Flush(NoOwner)
	wait("cached")
}

func TestMonitorChoice(t *testing.T) {
	c := newCache(t, nil)
	rep := c.Monitor()
	t.Logf("monitor: %v", rep)
	// A probe must not lie: where eBPF loads, Auto picks it; where it does
	// not, the report names eBPF as not supported.
	probe, ebpfErr := bpfmon.Open(nil)
	if ebpfErr == nil {
		probe.Close()
		if rep.Kind != MonitorEBPF || len(rep.Skipped) != 0 {
			t.Errorf("eBPF loads here but auto picked %v", rep)
		}
		// The per-call tracepoints first: they cost the host nothing for
		// the system calls we do not watch.
		if rep.Attach != string(probe.Method()) {
			t.Errorf("auto attached by %q; bpfmon's default picks %q", rep.Attach, probe.Method())
		}
		c, err := New(&Config{Monitor: MonitorEBPF})
		if err != nil {
			t.Fatalf("explicit ebpf: %v", err)
		}
		c.Close()
	} else {
		t.Logf("eBPF here: %v", ebpfErr)
		if len(rep.Skipped) == 0 || rep.Skipped[0].Kind != MonitorEBPF || !errors.Is(rep.Skipped[0].Err, ErrNotSupported) {
			t.Errorf("report %v: want ebpf skipped as not supported", rep)
		}
		if _, err := New(&Config{Monitor: MonitorEBPF}); !errors.Is(err, ErrNotSupported) {
			t.Errorf("explicit ebpf: %v, want ErrNotSupported", err)
		}
	}
	switch rep.Kind {
	case MonitorEBPF:
	case MonitorUserfaultfd:
	case MonitorOwned:
		// Only acceptable when userfaultfd is reported unusable, and a
		// probe must not lie: a uffd-capable root must get it.
		i := slices.IndexFunc(rep.Skipped, func(s MonitorSkip) bool { return s.Kind == MonitorUserfaultfd })
		if i < 0 || !errors.Is(rep.Skipped[i].Err, ErrNotSupported) {
			t.Errorf("owned monitor without a userfaultfd reason: %v", rep)
		}
		if _, err := sys.Userfaultfd(0); err == nil {
			t.Errorf("userfaultfd opens here but the monitor reported %v", rep)
		}
	default:
		t.Errorf("auto picked %v", rep.Kind)
	}
	for _, k := range []MonitorKind{MonitorUserfaultfd, MonitorOwned, MonitorNone} {
		c, err := New(&Config{Monitor: k})
		if k == MonitorUserfaultfd && errors.Is(err, ErrNotSupported) {
			continue
		}
		if err != nil || c.Monitor().Kind != k || len(c.Monitor().Skipped) != 0 {
			t.Errorf("explicit %v: %v, %v", k, c.Monitor(), err)
		}
		c.Close()
	}
}

func init() {
	testutil.RegisterChild("unprivileged", childUnprivileged)
}

// childUnprivileged runs as uid 65534 with RLIMIT_MEMLOCK of 64 KiB.
func childUnprivileged(args []string) error {
	if sys.Geteuid() == 0 || sys.HasCapIPCLock() {
		return fmt.Errorf("child runs privileged")
	}
	const limit = 64 << 10
	if err := sys.SetMemlockLimit(limit, limit); err != nil {
		return fmt.Errorf("lower RLIMIT_MEMLOCK: %w", err)
	}
	if d := DefaultConfig(); d.MaxPinnedBytes != limit {
		return fmt.Errorf("default budget %d, want RLIMIT_MEMLOCK %d", d.MaxPinnedBytes, limit)
	}
	// A budget above the rlimit, so that mlock itself fails.
	c, err := New(&Config{MaxPinnedBytes: 1 << 30})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("monitor: %v\n", c.Monitor())
	if c.Monitor().Kind != MonitorUserfaultfd {
		return fmt.Errorf("unprivileged monitor %v, want userfaultfd (UFFD_USER_MODE_ONLY)", c.Monitor())
	}
	if sk := c.Monitor().Skipped; len(sk) == 0 || sk[0].Kind != MonitorEBPF || !errors.Is(sk[0].Err, ErrNotSupported) {
		return fmt.Errorf("unprivileged report %v: want eBPF skipped as not supported", c.Monitor())
	}
	a, err := Alloc(32 << 10)
	if err != nil {
		return err
	}
	defer Free(a)
	b, err := Alloc(48 << 10)
	if err != nil {
		return err
	}
	defer Free(b)
	h, err := c.Register(a, 0)
	if err != nil {
		return fmt.Errorf("register 32 KiB: %w", err)
	}
	c.Deregister(h)
	// 32 + 48 KiB > 64 KiB: mlock fails, the unused entry is evicted,
	// the retry succeeds.
	h, err = c.Register(b, 0)
	if err != nil {
		return fmt.Errorf("register 48 KiB after evicting: %w", err)
	}
	if ev := c.Stats().Evictions; ev != 1 {
		return fmt.Errorf("evictions %d, want 1", ev)
	}
	// Now 48 KiB in use: 32 KiB more cannot be pinned.
	_, err = c.Register(a, 0)
	if !errors.Is(err, syscall.ENOBUFS) {
		return fmt.Errorf("register past RLIMIT_MEMLOCK: %v, want ENOBUFS", err)
	}
	fmt.Printf("past the limit: %v\n", err)
	c.Deregister(h)
	return nil
}

func TestUnprivilegedChild(t *testing.T) {
	if sys.Geteuid() != 0 {
		t.Skip("needs root to start a child as uid 65534")
	}
	ch := testutil.StartChildAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "unprivileged", nil)
	if err := ch.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("child:\n%s", ch.Output())
}
