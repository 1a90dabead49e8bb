package shm

import (
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
)

func TestMain(m *testing.M) {
	// The rings' fence-free ways start once the process is registered for
	// global barriers (in the background, at the first ring): the tests of
	// those ways need it through before their rings attach.
	// TestBarriersRegisteredLater holds a ring in the time before.
	_ = sys.MembarrierRegister()
	testutil.Main(m)
}
