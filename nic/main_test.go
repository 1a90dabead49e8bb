package nic

import (
	"testing"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/pin"
)

// The devices' registration caches leave their eBPF monitor idle for the
// next device (pin.SetIdleMonitorLinger): closed before the leak check.
func TestMain(m *testing.M) { testutil.Main(m, pin.CloseIdleMonitors) }
