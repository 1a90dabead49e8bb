package nic

import (
	"os"
	"testing"
	"time"

	"github.com/sandirect/sandirect/stats"
)

func statGroup(t *testing.T, d *Device) string {
	t.Helper()
	s, ok := published.Load(d)
	if !ok {
		t.Fatal("device not published")
	}
	return s.(*statSource).group
}

// TestStatsPublished reads this process's statistics table as sdstat would
// and finds the device's, its cache's and its queue pairs' counters there.
func TestStatsPublished(t *testing.T) {
	a, b := pair(t, nil, nil)
	ga, gb := statGroup(t, a.d), statGroup(t, b.d)
	if ga == gb {
		t.Fatalf("two devices share group %s", ga)
	}
	rbuf := make([]byte, 64)
	rmr := register(t, b.d, rbuf, AccessLocalWrite)
	const sends = 5
	for i := range sends {
		if err := b.qp.PostRecv(RecvWR{ID: uint64(i), Buf: rbuf, LKey: rmr.LKey}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(SendWR{ID: uint64(i), Op: OpSend, Local: []byte("hello")}); err != nil {
			t.Fatal(err)
		}
		wait(t, a.scq)
		wait(t, b.rcq)
	}
	r, err := stats.Open(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var s stats.Snapshot
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s, err = r.Snapshot(); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.Get(ga, "sends"); v == sends {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s sends never reached %d: %+v", ga, sends, s.Counters)
		}
		time.Sleep(time.Millisecond) // poll the next refresh
	}
	want := []struct {
		group, name string
		v           uint64
	}{
		{ga, "bytes_sent", 5 * sends},
		{ga, "queue_pairs", 1},
		{gb, "recvs", sends},
		{gb, "bytes_received", 5 * sends},
		{gb, "regions", 1},
		{ga + "/qp/1", "sends", sends},
		{ga + "/qp/1", "state", uint64(QPReady)},
		{ga + "/qp/1", "peer_pid", uint64(os.Getpid())},
		{gb + "/qp/1", "recvs", sends},
	}
	for _, w := range want {
		if v, ok := s.Get(w.group, w.name); !ok || v != w.v {
			t.Errorf("%s %s = %d (%v), want %d", w.group, w.name, v, ok, w.v)
		}
	}
	if b.d.Cache() != nil {
		if _, ok := s.Get(gb+"/pin", "gets"); !ok {
			t.Errorf("no %s/pin counters", gb)
		}
		mon := "monitor_" + b.d.Cache().Monitor().Kind.String()
		if v, ok := s.Get(gb+"/pin", mon); !ok || v != 1 {
			t.Errorf("%s/pin %s = %d, %v", gb, mon, v, ok)
		}
	}
	// A closed device leaves the table.
	a.qp.Close()
	a.d.Close()
	for {
		if s, err = r.Snapshot(); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Get(ga, "sends"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("closed device %s still published", ga)
		}
		time.Sleep(time.Millisecond) // poll the next refresh
	}
}
