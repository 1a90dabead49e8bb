package sockets

import (
	"io"
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

// TestReadTakesInline: a Read whose message is in the ring already takes
// it under its own lock (pollInlineLocked), and InlineTakes counts it.
func TestReadTakesInline(t *testing.T) {
	c, sc := pipe(t, nil, nil)
	s := sc.(*Conn)
	const rounds = 50
	msg, buf := []byte("in the ring before the Read"), make([]byte, 64)
	for i := range rounds {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		n, err := s.Read(buf)
		if err != nil || string(buf[:n]) != string(msg) {
			t.Fatalf("round %d: %q, %v", i, buf[:n], err)
		}
	}
	if got := s.Stats().InlineTakes; got == 0 {
		t.Fatalf("%d Reads of messages in the ring, none taken inline: %+v", rounds, s.Stats())
	}
}

// TestPollerWaitsCounted: a Write that waits for credit while a Read of
// the same connection polls waits for the Read's round, and PollerWaits
// counts it; the Write goes on once the peer reads.
func TestPollerWaitsCounted(t *testing.T) {
	cc, s := pipe(t, nil, nil)
	c := cc.(*Conn)
	readDone := make(chan error, 1)
	go func() {
		buf := make([]byte, 1)
		_, err := c.Read(buf) // polls until s writes, at the end
		readDone <- err
	}()
	waitFor(t, "the Read polls", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.polling
	})
	const writes, size = 100, 64
	writeDone := make(chan error, 1)
	go func() {
		msg := make([]byte, size)
		for range writes {
			if _, err := c.Write(msg); err != nil {
				writeDone <- err
				return
			}
		}
		writeDone <- nil
	}()
	waitFor(t, "a Write waits for the Read's round", func() bool { return c.Stats().PollerWaits > 0 })
	if _, err := io.ReadFull(s, make([]byte, writes*size)); err != nil {
		t.Fatal(err)
	}
	if err := <-writeDone; err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
}
