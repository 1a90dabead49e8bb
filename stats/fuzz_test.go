package stats

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// FuzzDecode feeds decode tables another process could have written: it
// must return a snapshot or an error, never panic, and whatever it returns
// must obey the layout.
func FuzzDecode(f *testing.F) {
	f.Add(encodeValid(f, []entry{{"device/1", "sends", 7}, {"device/1/qp/1", "bytes_sent", 1 << 40}}))
	f.Add(encodeValid(f, nil))
	f.Add(encodeValid(f, []entry{{"0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef0123456789abcdef", 1}}))
	f.Add(make([]byte, entriesOff))
	f.Fuzz(func(t *testing.T, data []byte) {
		// decode wants a word-aligned region of whole words, as a mapping
		// gives it; keep the fuzzer's bytes as they are otherwise.
		mem := make([]byte, (len(data)+7)&^7)
		copy(mem, data)
		s, state, err := decode(mem)
		if err != nil {
			return
		}
		_ = state
		capacity := binary.LittleEndian.Uint32(mem[hCapacityOff:])
		if uint32(len(s.Counters)) > capacity || len(s.Counters)*entrySize > len(mem)-entriesOff {
			t.Fatalf("%d counters from a table of capacity %d, %d bytes", len(s.Counters), capacity, len(mem))
		}
		for _, c := range s.Counters {
			if !validName(c.Group, MaxGroupLen) || !validName(c.Name, MaxNameLen) {
				t.Fatalf("invalid counter %q %q", c.Group, c.Name)
			}
		}
		if s.Interval < 0 || s.Time.UnixNano() < 0 {
			t.Fatalf("interval %v, time %v", s.Interval, s.Time)
		}
	})
}

func FuzzParseUnix(f *testing.F) {
	f.Add([]byte(procNetUnix))
	f.Add([]byte("0: 2 0 10000 1 1 5 @sandirect-stats-1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pids, err := parseUnix(bytes.NewReader(data))
		if err != nil {
			return
		}
		for i, p := range pids {
			if p <= 0 || (i > 0 && pids[i-1] >= p) {
				t.Fatalf("pids %v", pids)
			}
			if !strings.Contains(string(data), Address(p)) {
				t.Fatalf("pid %d not in input", p)
			}
		}
	})
}
