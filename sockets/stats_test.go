package sockets

import "testing"

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
