package sockets

import (
	"reflect"
	"strings"
	"testing"
	"unicode"
)

func TestGlobalStats(t *testing.T) {
	before := GlobalStats()
	c, s := pipe(t, nil, nil)
	// Written before the Read: a Write counts its bytes after it sent
	// them, and the Read can return before a concurrent Write counted.
	if _, err := c.Write([]byte("counted")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := s.Read(buf); err != nil {
		t.Fatal(err)
	}
	mid := GlobalStats()
	// Other tests' connections may still be lingering: at least ours.
	if mid.BytesEager-before.BytesEager < 7 || mid.BytesRead-before.BytesRead < 7 {
		t.Fatalf("live: %+v", mid)
	}
	c.Close()
	s.Close()
	waitTorn(t, c)
	waitTorn(t, s)
	if after := GlobalStats(); after.BytesEager-before.BytesEager < 7 {
		t.Fatalf("retired: %+v", after)
	}
}

// TestEveryCounterPublished: tools/sdstat sees every field of Counters,
// by its snake_case name.
func TestEveryCounterPublished(t *testing.T) {
	got := map[string]bool{}
	snapshotStats(func(group, name string, v uint64) {
		if group != statsGroup {
			t.Errorf("group %q", group)
		}
		got[name] = true
	})
	ct := reflect.TypeFor[Counters]()
	for i := range ct.NumField() {
		if name := snakeCase(ct.Field(i).Name); !got[name] {
			t.Errorf("Counters.%s is not published (as %q)", ct.Field(i).Name, name)
		}
	}
}

// snakeCase turns a Go name into a published one: BytesCopiedNT is
// bytes_copied_nt, RDMAReads rdma_reads, ENOBUFS enobufs.
func snakeCase(s string) string {
	var b strings.Builder
	r := []rune(s)
	for i, c := range r {
		upper := unicode.IsUpper(c)
		if upper && i > 0 && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}
