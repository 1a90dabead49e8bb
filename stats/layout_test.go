package stats

import (
	"testing"

	"github.com/sandirect/sandirect/shm"
)

func TestLayoutChains(t *testing.T) {
	checks := []struct {
		name      string
		got, want int
	}{
		{"table header after the segment header", tabHeaderOff, shm.SegmentHeaderSize},
		{"seq is 8-byte aligned", hSeqOff % 8, 0},
		{"interval is 8-byte aligned", hIntervalOff % 8, 0},
		{"header fields end", hEnd, 56},
		{"entries follow one header line", entriesOff, 128},
		{"entry size", entrySize, 96},
		{"entry is whole words", entrySize % 8, 0},
		{"group field is whole words", MaxGroupLen % 8, 0},
		{"name field is whole words", MaxNameLen % 8, 0},
		{"name after group", eNameOff, eGroupOff + MaxGroupLen},
		{"lengths fit a byte", min(MaxGroupLen, MaxNameLen, 255), min(MaxGroupLen, MaxNameLen)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
	if hEnd > tabHeaderSize {
		t.Errorf("table header fields (%d bytes) overflow their line", hEnd)
	}
	if tableSize(MaxEntries) > shm.MaxSegmentSize {
		t.Errorf("a full table does not fit a segment")
	}
	if KindStats < shm.KindUser {
		t.Errorf("KindStats %#x below shm.KindUser", KindStats)
	}
}

func TestValidName(t *testing.T) {
	for _, c := range []struct {
		s    string
		max  int
		want bool
	}{
		{"device/1", MaxGroupLen, true},
		{"bytes_sent", MaxNameLen, true},
		{"a.b:c-d_E9", MaxNameLen, true},
		{"", MaxNameLen, false},
		{"has space", MaxNameLen, false},
		{"esc\x1b[2J", MaxNameLen, false},
		{"ünï", MaxNameLen, false},
		{string(make([]byte, 33)), MaxGroupLen, false},
		{"0123456789abcdef0123456789abcdef", MaxGroupLen, true},
		{"0123456789abcdef0123456789abcdef0", MaxGroupLen, false},
	} {
		if got := validName(c.s, c.max); got != c.want {
			t.Errorf("validName(%q, %d) = %v, want %v", c.s, c.max, got, c.want)
		}
	}
}
