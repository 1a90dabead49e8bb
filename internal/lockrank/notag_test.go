//go:build !lockrank

package lockrank

import (
	"sync"
	"testing"
	"unsafe"
)

// TestNoTagNoChecks: without the tag a lock out of order is not noticed
// and a Mutex is the size of a sync.Mutex.
func TestNoTagNoChecks(t *testing.T) {
	if Enabled {
		t.Fatal("Enabled without the lockrank tag")
	}
	var hi, lo Mutex
	hi.Init(Hub)
	lo.Init(ConnLend)
	hi.Lock()
	lo.Lock()
	critical++
	lo.Unlock()
	hi.Unlock()
	if v := Violations(); v != nil {
		t.Fatalf("violations without the tag: %v", v)
	}
	if n, want := unsafe.Sizeof(hi), unsafe.Sizeof(sync.Mutex{}); n != want {
		t.Errorf("Mutex is %d bytes, a sync.Mutex %d", n, want)
	}
}
