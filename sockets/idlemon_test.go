package sockets

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sandirect/sandirect/pin"
)

// TestIdleMonitorAcrossDevices: a program whose device closed between
// two bursts of connections does not load the eBPF monitor again: the
// next device's registration cache adopts the one the last left idle,
// and runs it as the dial returns.
func TestIdleMonitorAcrossDevices(t *testing.T) {
	pin.SetIdleMonitorLinger(time.Minute)
	defer pin.SetIdleMonitorLinger(0) // and closes it: TestMain's setting
	// The device closes when the test says, not when TestMain's short
	// linger runs out under a slow build.
	defer setDeviceLinger(setDeviceLinger(time.Minute))
	addr := fmt.Sprintf("@sandirect-idlemon-%d", os.Getpid())
	startPathListener(t, addr)
	// A device of its own (devices are shared by configuration): one
	// another test's connection still holds would never be idle here.
	cfg := DefaultConfig()
	cfg.MaxRegions = 4093
	d := Dialer{Config: &cfg}
	c, err := d.Dial("sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	cache := c.(*Conn).dev.nic.Cache()
	if rep := cache.Monitor(); rep.Kind != pin.MonitorEBPF {
		c.Close()
		t.Skipf("monitor %v: idle monitors are eBPF's", rep)
	}
	c.Close()
	waitTorn(t, c)
	if closeIdleDevices() == 0 {
		t.Fatal("the dialer's device is not idle after its connection was torn down")
	}
	opened := devicesOpened.Load()
	c, err = d.Dial("sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c.Close()
		waitTorn(t, c)
		closeIdleDevices()
	}()
	if devicesOpened.Load() != opened+1 {
		t.Fatal("the second dial opened no device of its own")
	}
	cache2 := c.(*Conn).dev.nic.Cache()
	if cache2 == cache {
		t.Fatal("the second dial's device has the first one's cache")
	}
	if rep := cache2.CurrentMonitor(); rep.Kind != pin.MonitorEBPF || rep.Starting {
		t.Fatalf("the second device's monitor as its dial returns: %v, want the idle eBPF monitor adopted", rep)
	}
	ping(t, c)
}

// TestConnMonitor: a connection reports its device's registration
// monitor once the background start is over — the one the device's cache
// runs, never the placeholder of the start — and, as root with eBPF
// required here, the eBPF monitor with its attach point. The dial opens a
// device of its own with no idle monitor to adopt: its monitor starts
// loading with it.
func TestConnMonitor(t *testing.T) {
	if err := pin.CloseIdleMonitors(); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("@sandirect-connmon-%d", os.Getpid())
	startPathListener(t, addr)
	cfg := DefaultConfig()
	cfg.MaxRegions = 4091 // devices are shared by configuration
	d := Dialer{Config: &cfg}
	c, err := d.Dial("sandirect", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := c.(*Conn)
	rep := conn.Monitor()
	if rep.Starting || rep.Kind == pin.MonitorAuto {
		t.Fatalf("Monitor() = %+v: still starting", rep)
	}
	if cur := conn.dev.nic.Cache().CurrentMonitor(); cur.Kind != rep.Kind || cur.Attach != rep.Attach {
		t.Fatalf("Monitor() = %+v, the cache runs %+v", rep, cur)
	}
	if rep.Kind == pin.MonitorEBPF && rep.Attach == "" {
		t.Fatalf("Monitor() = %+v: eBPF without its attach point", rep)
	}
	if os.Getenv("SANDIRECT_REQUIRE_EBPF") != "" && os.Geteuid() == 0 && rep.Kind != pin.MonitorEBPF {
		t.Fatalf("Monitor() = %+v, want eBPF (SANDIRECT_REQUIRE_EBPF)", rep)
	}
}
