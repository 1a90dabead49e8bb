package sockets

import (
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/pin"
)

func TestMain(m *testing.M) {
	// Devices outlive their last connection by deviceLinger; the leak
	// checks after a test wait 2 s for what it opened to go.
	deviceLinger = 50 * time.Millisecond
	// Nor does a device's eBPF monitor stay loaded for the next: the
	// campaign's leak checks count its fds. TestIdleMonitorAcrossDevices
	// turns it on.
	pin.SetIdleMonitorLinger(0)
	testutil.Main(m)
}
