package pin

import (
	"testing"

	"github.com/sandirect/sandirect/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m, CloseIdleMonitors) }
