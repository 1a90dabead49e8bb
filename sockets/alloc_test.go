package sockets

import (
	"io"
	"net"
	"runtime"
	"testing"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/shm"
)

// TestSmallIOAllocates checks that a small Write and a small Read make no
// heap allocation, in each direction and wait mode: the per-message path
// of a connection is a reserve, a copy and a commit into the ring, and a
// copy out of it. The count is the process's (runtime.MemStats), and the
// statistics publisher allocates in the background every 100 ms: a run
// of rounds counts if it saw no allocation at all, and one of a few runs
// must. Under the race detector, whose instrumentation allocates, and the
// lock-rank checker, whose bookkeeping does, it is skipped.
func TestSmallIOAllocates(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	if lockrank.Enabled {
		t.Skip("the lock-rank checker allocates")
	}
	def := DefaultConfig()
	sizes := []int{1, 64, 1024, def.BufferSize - headerSize, def.EagerThreshold}
	for _, tc := range []struct {
		name string
		cfg  *Config
	}{
		{"busy", &Config{Wait: shm.WaitConfig{Mode: shm.WaitBusyPoll}}},
		{"block", &Config{Wait: shm.WaitConfig{Mode: shm.WaitBlock}}},
		{"default", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := pipe(t, tc.cfg, tc.cfg)
			for _, size := range sizes {
				t.Run(sizeName(size), func(t *testing.T) {
					for _, d := range []struct {
						name string
						w, r net.Conn
					}{{"client to server", c, s}, {"server to client", s, c}} {
						var w, r float64
						for range 5 {
							if w, r = ioAllocs(t, d.w, d.r, size); w == 0 && r == 0 {
								break
							}
						}
						if w != 0 || r != 0 {
							t.Errorf("%s: %.2f allocations per Write, %.2f per Read of %d bytes", d.name, w, r, size)
						}
					}
				})
			}
		})
	}
}

// ioAllocs writes size bytes on w and reads them on r, many times in one
// goroutine, and returns the heap allocations per Write and per Read
// (after a warm-up that lets buffers and queues reach their size).
func ioAllocs(t *testing.T, w, r net.Conn, size int) (perWrite, perRead float64) {
	t.Helper()
	out, in := make([]byte, size), make([]byte, size)
	for i := range out {
		out[i] = byte(i)
	}
	round := func() (uint64, uint64) {
		var m0, m1, m2 runtime.MemStats
		runtime.ReadMemStats(&m0)
		if _, err := w.Write(out); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&m1)
		if _, err := io.ReadFull(r, in); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&m2)
		return m1.Mallocs - m0.Mallocs, m2.Mallocs - m1.Mallocs
	}
	for range 64 {
		round()
	}
	const rounds = 200
	var wa, ra uint64
	for range rounds {
		a, b := round()
		wa += a
		ra += b
	}
	if in[size-1] != out[size-1] {
		t.Fatalf("read %d, wrote %d", in[size-1], out[size-1])
	}
	return float64(wa) / rounds, float64(ra) / rounds
}
