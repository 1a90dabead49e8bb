package main

import (
	"errors"
	"strings"
	"time"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/stats"
)

// openSyscalls attaches the pin monitor's system call probes
// (internal/bpfmon) for process pid alone, reporting every range it
// unmaps, remaps or discards.
func openSyscalls(pid int) (*bpfmon.Monitor, error) {
	m, err := bpfmon.Open(&bpfmon.Config{ExcludeSelf: true, WatchAll: true})
	if err != nil {
		return nil, err
	}
	if err := m.AddPid(pid); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// counterOrder is the order of the counters of a "counters" event.
var counterOrder = []string{
	"pin_gets", "pin_hits", "pin_misses", "pin_invalidations",
	"nic_sends", "nic_recvs", "nic_writes", "nic_reads", "nic_bytes",
	"sockets_bytes_written", "sockets_bytes_read", "sockets_rendezvous", "sockets_enobufs",
}

// sumCounters adds up what the process publishes (see nic/stats.go and
// sockets/publish.go) into the totals of counterOrder.
func sumCounters(s *stats.Snapshot) map[string]uint64 {
	t := map[string]uint64{}
	for _, c := range s.Counters {
		g := c.Group
		switch {
		case strings.HasPrefix(g, "device/") && strings.HasSuffix(g, "/pin") && strings.Count(g, "/") == 2:
			switch c.Name {
			case "gets", "hits", "misses", "invalidations":
				t["pin_"+c.Name] += c.Value
			}
		case strings.HasPrefix(g, "device/") && strings.Count(g, "/") == 1:
			switch c.Name {
			case "sends", "recvs", "writes", "reads":
				t["nic_"+c.Name] += c.Value
			case "bytes_sent", "bytes_written", "bytes_read":
				t["nic_bytes"] += c.Value
			}
		case g == "sockets":
			switch c.Name {
			case "bytes_eager", "bytes_inline", "bytes_read_rendezvous", "bytes_write_rendezvous":
				t["sockets_bytes_written"] += c.Value
			case "bytes_read", "rendezvous", "enobufs":
				t["sockets_"+c.Name] += c.Value
			}
		}
	}
	return t
}

// counterSource reads the target's published counters, when it publishes
// them, and returns the change since the last call.
type counterSource struct {
	pid  int
	r    *stats.Reader
	last map[string]uint64
}

func (s *counterSource) delta() (map[string]int64, error) {
	if s.r == nil {
		r, err := stats.Open(s.pid)
		if err != nil {
			return nil, err
		}
		s.r = r
	}
	snap, err := s.r.Snapshot()
	if err != nil {
		if errors.Is(err, stats.ErrGone) {
			s.r.Close()
			s.r = nil
		}
		return nil, err
	}
	now := sumCounters(&snap)
	d := map[string]int64{}
	for _, k := range counterOrder {
		if _, ok := now[k]; !ok {
			continue
		}
		if v := int64(now[k] - s.last[k]); v != 0 {
			d[k] = v
		}
	}
	first := s.last == nil
	s.last = now
	if first || len(d) == 0 {
		return nil, nil // a baseline, or nothing changed: nothing to show
	}
	return d, nil
}

func (s *counterSource) close() {
	if s.r != nil {
		s.r.Close()
	}
}

// syscallEvent is a system call event of the fallback stream.
func syscallEvent(e bpfmon.Event, when time.Time) *Event {
	ev := &Event{Time: when, Kind: "syscall", Op: e.Syscall.String(), Tid: e.Tid, Addr: uint64(e.Start), Len: uint64(e.Length)}
	if e.Dest {
		ev.Note = "destination"
	}
	return ev
}
