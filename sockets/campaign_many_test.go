package sockets

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// TestCampaignThousandConnections opens 2,000 connections between this
// process and an echo child (more than the 1,365 a device's 4,096 regions
// allowed when every connection registered three of its own), exchanges data on each (every tenth by
// rendezvous), closes them all, and checks that nothing is left. It logs
// what one connection costs this process: fds, shared mappings, locked
// memory and resident memory.
func TestCampaignThousandConnections(t *testing.T) {
	const n = 2000
	raiseMemlock(t, n*64<<10) // a connection locks 48 kB here, as much in the child
	base := takeBaseline(t)
	addr := testAddr()
	child := testutil.StartChild(t, "echo", nil, addr, strconv.Itoa(n))
	before := costNow(t)
	start := time.Now()
	conns := make([]net.Conn, n)
	conns[0] = dialChild(t, child, nil, "sandirect", addr)
	for i := 1; i < n; i++ {
		c, err := Dial("sandirect", addr)
		if err != nil {
			t.Fatalf("dial %d: %v (%d fds open)", i, err, costNow(t).fds)
		}
		conns[i] = c
	}
	t.Logf("%d connections open in %v", n, time.Since(start).Round(time.Millisecond))
	open := costNow(t)
	d := open.sub(before)
	t.Logf("per connection: %.2f fds, %.2f shared mappings, %.1f kB locked, %.1f kB resident (process totals at %d: %d fds, %d mappings, %d kB locked, %d kB resident)",
		float64(d.fds)/n, float64(d.maps)/n, float64(d.lockedKB)/n, float64(d.rssKB)/n, n, open.fds, open.maps, open.lockedKB, open.rssKB)

	echoAll(t, conns, func(i int) int {
		if i%10 == 0 {
			return 100<<10 + i // a rendezvous
		}
		return 1000 + i
	}, 60*time.Second)
	if err := child.Wait(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		waitTorn(t, c)
	}
	t.Logf("all exchanged and closed %v after the first dial", time.Since(start).Round(time.Millisecond))
	base.check(t)
}

// cost is what the process holds.
type cost struct{ fds, maps, lockedKB, rssKB int }

func (a cost) sub(b cost) cost {
	return cost{a.fds - b.fds, a.maps - b.maps, a.lockedKB - b.lockedKB, a.rssKB - b.rssKB}
}

func costNow(t *testing.T) cost {
	r := testutil.Snapshot()
	maps, _ := os.ReadFile("/proc/self/maps")
	return cost{
		fds:      len(r.Fds),
		maps:     strings.Count(string(maps), "\n"),
		lockedKB: procStatus(t, "VmLck"),
		rssKB:    procStatus(t, "VmRSS"),
	}
}

// raiseMemlock makes sure need bytes may be locked: as root nothing is
// needed (CAP_IPC_LOCK); otherwise the soft RLIMIT_MEMLOCK is raised
// towards the hard one (children inherit it), and the test is skipped
// when even that is too low.
func raiseMemlock(t *testing.T, need uint64) {
	if os.Geteuid() == 0 {
		return
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(rlimitMemlock, &old); err != nil {
		t.Fatal(err)
	}
	if old.Cur >= need {
		return
	}
	if old.Max < need {
		t.Skipf("RLIMIT_MEMLOCK hard limit %d bytes, the test locks about %d", old.Max, need)
	}
	raised := syscall.Rlimit{Cur: old.Max, Max: old.Max}
	if err := syscall.Setrlimit(rlimitMemlock, &raised); err != nil {
		t.Skipf("raise RLIMIT_MEMLOCK to %d: %v", old.Max, err)
	}
	t.Cleanup(func() { syscall.Setrlimit(rlimitMemlock, &old) })
}

const rlimitMemlock = 8 // RLIMIT_MEMLOCK on Linux (not in package syscall)
