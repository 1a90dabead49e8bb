package sockets

import (
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

func TestMain(m *testing.M) {
	// Devices outlive their last connection by deviceLinger; the leak
	// checks after a test wait 2 s for what it opened to go.
	deviceLinger = 50 * time.Millisecond
	testutil.Main(m)
}
