package stats

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// openOwn maps t's segment a second time, read-only, as a reader would.
func openOwn(t *testing.T, tab *table) []byte {
	t.Helper()
	fd, err := sys.Dup(tab.seg.Fd())
	if err != nil {
		t.Fatal(err)
	}
	seg, err := shm.OpenSegmentReadOnly(fd, KindStats, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	mem, err := seg.Region(tabHeaderOff, seg.Size()-tabHeaderOff)
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

func newTestTable(t *testing.T, n int) *table {
	t.Helper()
	tab, err := newTable(n, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tab.close() })
	return tab
}

func TestTableRoundTrip(t *testing.T) {
	tab := newTestTable(t, 0)
	mem := openOwn(t, tab)
	want := []entry{
		{"device/1", "sends", 42},
		{"device/1/qp/1", "bytes_sent", 1 << 63},
		{"0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef0123456789abcdef", ^uint64(0)},
		{"g", "n", 0},
	}
	now := time.Unix(1700000000, 123)
	tab.write(want, now, 250*time.Millisecond, 3)
	s, state, err := decode(mem)
	if err != nil || state != stateLive {
		t.Fatalf("decode: %v, state %d", err, state)
	}
	if !s.Time.Equal(now) || s.Interval != 250*time.Millisecond || s.Dropped != 3 {
		t.Errorf("header: time %v interval %v dropped %d", s.Time, s.Interval, s.Dropped)
	}
	if len(s.Counters) != len(want) {
		t.Fatalf("%d counters, want %d", len(s.Counters), len(want))
	}
	for i, c := range s.Counters {
		if c.Group != want[i].group || c.Name != want[i].name || c.Value != want[i].value {
			t.Errorf("counter %d: %+v, want %+v", i, c, want[i])
		}
	}
	// A shorter refresh leaves no trace of the longer one.
	tab.write(want[:1], now, time.Second, 0)
	if s, _, err = decode(mem); err != nil || len(s.Counters) != 1 {
		t.Fatalf("after a shorter write: %d counters, %v", len(s.Counters), err)
	}
	tab.setState(stateReplaced)
	if _, state, _ = decode(mem); state != stateReplaced {
		t.Errorf("state %d, want replaced", state)
	}
}

func TestTableOverCapacity(t *testing.T) {
	tab := newTestTable(t, 0)
	mem := openOwn(t, tab)
	es := make([]entry, tab.capacity+5)
	for i := range es {
		es[i] = entry{"g", fmt.Sprintf("c%d", i), uint64(i)}
	}
	tab.write(es, time.Now(), time.Second, 1)
	s, _, err := decode(mem)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Counters) != tab.capacity || s.Dropped != 6 {
		t.Errorf("%d counters, %d dropped; want %d, 6", len(s.Counters), s.Dropped, tab.capacity)
	}
}

// TestSeqlock has a writer rewrite a table as fast as it can, every counter
// of one refresh holding the same value, while readers decode it: a copy
// mixing two refreshes would show two values. Both sides access every word
// atomically, so -race has nothing to report either.
func TestSeqlock(t *testing.T) {
	tab := newTestTable(t, 512)
	mem := openOwn(t, tab)
	const n = 100
	es := make([]entry, n)
	for i := range es {
		es[i] = entry{group: "g", name: fmt.Sprintf("c%d", i)}
	}
	tab.write(es, time.Now(), time.Second, 0)
	var stop atomic.Bool
	var attempts atomic.Int64 // the reader's; the writer paces itself on them
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := uint64(1); !stop.Load(); v++ {
			for i := range es {
				es[i].value = v
			}
			tab.write(es, time.Unix(0, int64(v)), time.Second, 0)
			// Wait for the reader to finish two copies: the one this
			// write overlapped, and one more, so that torn and clean
			// copies alternate instead of every copy overlapping a write.
			for a := attempts.Load(); attempts.Load() < a+2 && !stop.Load(); {
				runtime.Gosched()
			}
		}
	}()
	var good, torn int
	deadline := time.Now().Add(10 * time.Second)
	for (good < 2000 || torn < 10) && time.Now().Before(deadline) {
		s, _, err := decode(mem)
		attempts.Add(1)
		if errors.Is(err, errTorn) {
			torn++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		good++
		v := s.Counters[0].Value
		if uint64(s.Time.UnixNano()) != v && v != 0 {
			t.Fatalf("time %d with values %d", s.Time.UnixNano(), v)
		}
		for _, c := range s.Counters {
			if c.Value != v {
				t.Fatalf("torn copy: %s=%d beside %d", c.Name, c.Value, v)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if good == 0 || torn == 0 {
		t.Fatalf("%d consistent copies, %d torn: the test did not exercise the seqlock", good, torn)
	}
	t.Logf("%d consistent copies, %d torn ones retried", good, torn)
}

// TestDecodeCorrupt breaks one thing at a time in a valid table.
func TestDecodeCorrupt(t *testing.T) {
	valid := encodeValid(t, []entry{{"device/1", "sends", 7}, {"pin", "hits", 9}})
	e0 := entriesOff
	cases := []struct {
		name string
		off  int
		val  uint64
		size int // 4 or 8
	}{
		{"magic", hMagicOff, 1, 4},
		{"version", hVersionOff, 2, 4},
		{"entry size", hEntrySizeOff, 64, 4},
		{"capacity beyond the mapping", hCapacityOff, 1 << 20, 4},
		{"count above capacity", hCountOff, 1 << 16, 4},
		{"interval absurd", hIntervalOff, 1 << 62, 8},
		{"time negative", hTimeOff, 1 << 63, 8},
		{"group length zero", e0 + eLensOff, 0 | 5<<8, 8},
		{"group length too long", e0 + eLensOff, 33 | 5<<8, 8},
		{"name length too long", e0 + eLensOff, 8 | 49<<8, 8},
		{"reserved bytes", e0 + eLensOff, 8 | 5<<8 | 1<<16, 8},
		{"control byte in group", e0 + eGroupOff, 0x1b, 8},
		{"padding after name", e0 + eNameOff, uint64('s') | uint64('e')<<8 | uint64('n')<<16 | uint64('d')<<24 | uint64('s')<<32 | 1<<40, 8},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mem := make([]byte, len(valid))
			copy(mem, valid)
			if c.size == 4 {
				shm.StoreUint32(mem, c.off, uint32(c.val))
			} else {
				shm.StoreUint64(mem, c.off, c.val)
			}
			_, _, err := decode(mem)
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("decode: %v, want ErrCorrupt", err)
			}
		})
	}
	t.Run("odd seq", func(t *testing.T) {
		mem := make([]byte, len(valid))
		copy(mem, valid)
		shm.StoreUint64(mem, hSeqOff, 3)
		if _, _, err := decode(mem); !errors.Is(err, errTorn) {
			t.Errorf("decode: %v, want errTorn", err)
		}
	})
	t.Run("short region", func(t *testing.T) {
		if _, _, err := decode(valid[:64]); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decode: %v, want ErrCorrupt", err)
		}
	})
}

// encodeValid returns a copy of a table region holding es.
func encodeValid(t testing.TB, es []entry) []byte {
	tab, err := newTable(0, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.close()
	tab.write(es, time.Unix(1700000000, 0), 100*time.Millisecond, 0)
	// Keep the region small for the fuzzer: header and a few entries.
	n := entriesOff + 4*entrySize
	out := make([]byte, n)
	copy(out, tab.mem[:n])
	shm.StoreUint32(out, hCapacityOff, 4)
	return out
}
