package sockets

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// TestCampaignDialChurn: dial, echo and close 10,000 times (100,000 with
// SANDIRECT_CHURN=long) to a listener in another process; afterwards the
// process holds no more fds, shared mappings, goroutines or locked memory
// than after the first few connections (the device and its monitor stay
// for deviceLinger, and are in the baseline).
func TestCampaignDialChurn(t *testing.T) {
	cycles := 10_000
	if os.Getenv("SANDIRECT_CHURN") == "long" {
		cycles = 100_000
	}
	addr := fmt.Sprintf("@sandirect-churn-%d", os.Getpid())
	startPathListener(t, addr)
	defer func(d time.Duration) { deviceLinger = d }(deviceLinger)
	deviceLinger = time.Minute // one device for the whole run, as a busy dialer has
	for range 10 {
		echoOnce(t, addr)
	}
	if c, err := Dial("sandirect", addr); err == nil {
		waitMonitor(c) // its fds are part of the baseline
		c.Close()
		waitTorn(t, c)
	}
	// A dial with the monitor in place: the staging page each dial checks
	// stays pinned in the cache from now on, which it could not before.
	echoOnce(t, addr)
	opened := devicesOpened.Load()
	base := takeBaseline(t)
	start := time.Now()
	for i := range cycles {
		echoOnce(t, addr)
		if t.Failed() {
			t.Fatalf("cycle %d failed", i)
		}
	}
	t.Logf("%d dial+echo+close cycles in %v (%v each)", cycles, time.Since(start), time.Since(start)/time.Duration(cycles))
	if n := devicesOpened.Load() - opened; n != 0 {
		t.Errorf("%d devices opened during the churn, want 0 (the lingering one reused)", n)
	}
	if err := Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	base.check(t)
	closeIdleDevices()
}
