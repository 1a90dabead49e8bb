package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/sandirect/sandirect/internal/bpfmon"
	"github.com/sandirect/sandirect/nic"
)

// Event is one line of the event stream (and of -json).
type Event struct {
	Time time.Time `json:"time"`
	// Kind is register, deregister, invalidate, nic, sockets (uprobes),
	// syscall, counters (syscall mode), lost, start.
	Kind string `json:"kind"`
	// Op: hit or miss (register); send, recv, rdma-write, rdma-read
	// (nic); read or write (sockets); the system call (syscall).
	Op  string `json:"op,omitempty"`
	Tid uint32 `json:"tid,omitempty"`

	Addr uint64 `json:"addr,omitempty"` // the buffer, or the range of a syscall
	Len  uint64 `json:"len,omitempty"`
	// Entry is the cache entry a register hit, a deregister or an
	// invalidation concerns: its page-aligned registered range.
	Entry *Range `json:"entry,omitempty"`
	// Range is the part of the address space an invalidation removes.
	Range *Range `json:"range,omitempty"`
	// Cause is the system call that made the invalidation, as the
	// target's thread CauseTid made it; empty when none was seen (an
	// explicit Invalidate or a freed library buffer).
	Cause    string `json:"cause,omitempty"`
	CauseTid uint32 `json:"cause_tid,omitempty"`
	Unmapped bool   `json:"unmapped,omitempty"` // the pages are gone (not only remapped or discarded)

	QP     uint64 `json:"qp,omitempty"` // the queue pair (its address in the target)
	WR     uint64 `json:"wr,omitempty"` // the work request id
	Status string `json:"status,omitempty"`
	Conn   uint64 `json:"conn,omitempty"` // the connection (its address in the target)
	// Cache is how the registration cache served a nic registration:
	// hit or miss.
	Cache string `json:"cache,omitempty"`
	LKey  uint64 `json:"lkey,omitempty"`
	RKey  uint64 `json:"rkey,omitempty"`

	Bytes     int64 `json:"bytes,omitempty"`     // moved, or asked for (register)
	Requested int64 `json:"requested,omitempty"` // sockets: len(b)
	Failed    bool  `json:"failed,omitempty"`    // sockets: returned an error
	LatencyNS int64 `json:"latency_ns,omitempty"`

	Counters map[string]int64 `json:"counters,omitempty"` // syscall mode: change since the last line
	Lost     uint64           `json:"lost,omitempty"`
	Note     string           `json:"note,omitempty"`
}

// Range is [Addr, Addr+Len).
type Range struct {
	Addr uint64 `json:"addr"`
	Len  uint64 `json:"len"`
}

func (r *Range) String() string { return fmt.Sprintf("[%#x,+%#x)", r.Addr, r.Len) }

// printer writes events as text or JSON lines.
type printer struct {
	w     io.Writer
	json  bool
	quiet bool            // histograms only
	kinds map[string]bool // nil: every kind
}

func (p *printer) want(kind string) bool {
	if kind == "start" || kind == "lost" || kind == "note" {
		return true
	}
	if p.quiet && kind != "counters" {
		return false // -q: histograms and counters only
	}
	return p.kinds == nil || p.kinds[kind]
}

func (p *printer) event(e *Event) error {
	if !p.want(e.Kind) {
		return nil
	}
	if p.json {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "%s\n", b)
		return err
	}
	_, err := io.WriteString(p.w, e.text()+"\n")
	return err
}

func (p *printer) hists(hs *histograms) error {
	if p.json {
		for _, j := range hs.json() {
			b, err := json.Marshal(j)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(p.w, "%s\n", b); err != nil {
				return err
			}
		}
		return nil
	}
	fmt.Fprintf(p.w, "\n--- %s latency histograms\n", time.Now().Format("15:04:05"))
	hs.printText(p.w)
	return nil
}

func lat(ns int64) string {
	return time.Duration(ns).String()
}

// text is the event's line: time, thread, kind, then key=value fields.
func (e *Event) text() string {
	var b strings.Builder
	b.WriteString(e.Time.Format("15:04:05.000000"))
	if e.Tid != 0 {
		fmt.Fprintf(&b, " %-7d", e.Tid)
	} else {
		b.WriteString(" -      ")
	}
	fmt.Fprintf(&b, " %-10s", e.Kind)
	kv := func(k, v string) { b.WriteString(" " + k + "=" + v) }
	if e.Op != "" {
		fmt.Fprintf(&b, " %-10s", e.Op)
	}
	switch e.Kind {
	case "register", "deregister":
		kv("addr", fmt.Sprintf("%#x", e.Addr))
		kv("len", strconv.FormatUint(e.Len, 10))
		if e.Entry != nil {
			kv("entry", e.Entry.String())
		}
	case "invalidate":
		if e.Entry != nil {
			kv("entry", e.Entry.String())
		}
		kv("range", e.Range.String())
		cause := e.Cause
		if cause == "" {
			cause = "none-seen"
		} else if e.CauseTid != 0 {
			cause += "@" + strconv.FormatUint(uint64(e.CauseTid), 10)
		}
		kv("cause", cause)
		if e.Unmapped {
			b.WriteString(" unmapped")
		}
	case "nic":
		if e.Op == "register" {
			kv("addr", fmt.Sprintf("%#x", e.Addr))
			kv("len", strconv.FormatUint(e.Len, 10))
			kv("lkey", strconv.FormatUint(e.LKey, 10))
			if e.RKey != 0 {
				kv("rkey", fmt.Sprintf("%#x", e.RKey))
			}
			kv("cache", e.Cache)
			break
		}
		kv("qp", fmt.Sprintf("%#x", e.QP))
		kv("wr", strconv.FormatUint(e.WR, 10))
		kv("bytes", strconv.FormatInt(e.Bytes, 10))
		kv("status", e.Status)
	case "sockets":
		kv("conn", fmt.Sprintf("%#x", e.Conn))
		kv("bytes", strconv.FormatInt(e.Bytes, 10))
		kv("of", strconv.FormatInt(e.Requested, 10))
		if e.Failed {
			b.WriteString(" error")
		}
	case "syscall":
		kv("range", (&Range{e.Addr, e.Len}).String())
	case "counters":
		for _, k := range counterOrder {
			if v, ok := e.Counters[k]; ok {
				kv(k, fmt.Sprintf("%+d", v))
			}
		}
	case "lost":
		kv("records", strconv.FormatUint(e.Lost, 10))
	}
	if e.LatencyNS != 0 {
		kv("lat", lat(e.LatencyNS))
	}
	if e.Note != "" {
		b.WriteString(" " + e.Note)
	}
	return b.String()
}

// correlator turns probe records into events: it pairs the entry probes of
// a call with the probe that marks its outcome (by goroutine, or by queue
// pair and work request), and finds the system call behind an
// invalidation.
type correlator struct {
	clock  *clock
	hists  *histograms
	regs   map[uint64]pendingReg // goroutine → RegisterFor in progress
	nregs  map[uint64]pendingReg // goroutine → nic register in progress
	io     map[uint64]pendingIO  // goroutine → Read or Write in progress
	wrs    map[wrKey][]pendingWR // posted sends, oldest first
	recvs  map[wrKey][]pendingWR // posted receives, oldest first
	recent []bpfmon.Event        // system calls seen lately, oldest first
	mon    *bpfmon.Monitor       // nil: causes are not known
}

type pendingReg struct {
	ts        uint64
	addr, len uint64
	cache     string // nic registrations: how the cache served it
}

type pendingIO struct {
	ts   uint64
	conn uint64
	len  int64
	op   string
}

type wrKey struct{ qp, id uint64 }

type pendingWR struct {
	ts  uint64
	op  nic.Opcode
	len int64
}

// Bounds on what the correlator keeps for calls whose end it never sees
// (a failed register, a goroutine that exited, a queue pair that died).
const (
	maxPending = 1 << 16
	maxPerWR   = 1 << 12
	maxRecent  = 1 << 12
)

func newCorrelator(c *clock, hs *histograms, mon *bpfmon.Monitor) *correlator {
	return &correlator{
		clock: c, hists: hs, mon: mon,
		regs: map[uint64]pendingReg{}, nregs: map[uint64]pendingReg{}, io: map[uint64]pendingIO{},
		wrs: map[wrKey][]pendingWR{}, recvs: map[wrKey][]pendingWR{},
	}
}

// handle turns r into an event, or nil when r only starts a call.
func (c *correlator) handle(r *record) *Event {
	ev := &Event{Time: c.clock.wall(r.ts), Tid: r.tid}
	var ok bool
	switch r.probe {
	case pRegister, pHit, pMiss, pDeregister, pInvalidate:
		ok = c.pinEvent(r, ev)
	case pPostSend, pPostRecv, pSendDone, pRecvDone, pNicRegister, pNicRegistered:
		ok = c.nicEvent(r, ev)
	case pConnRead, pConnWrite, pConnDone:
		ok = c.socketsEvent(r, ev)
	}
	if !ok {
		return nil
	}
	return ev
}

// span is the range [lo, hi) of two registers.
func span(lo, hi uint64) *Range { return &Range{lo, hi - lo} }

// pinEvent fills ev from a probe of the registration cache (pin/trace.go)
// and reports whether it is an event.
func (c *correlator) pinEvent(r *record, ev *Event) bool {
	g, a := r.g, &r.regs
	switch r.probe {
	case pRegister:
		// RegisterFor(c, owner Owner, buf []byte, access): RCX buf.ptr, RDI buf.len.
		if len(c.regs) >= maxPending {
			clear(c.regs)
		}
		c.regs[g] = pendingReg{ts: r.ts, addr: a[rCX], len: a[rDI]}
		return false
	case pHit:
		c.noteCache(g, "hit")
		ev.Kind, ev.Op, ev.Entry = "register", "hit", span(a[rCX], a[rDI])
		ev.Addr, ev.Len, ev.Bytes = a[rAX], a[rBX], int64(a[rBX])
		if p, ok := c.regs[g]; ok {
			delete(c.regs, g)
			ev.LatencyNS = int64(r.ts - p.ts)
			c.hists.add("register hit", time.Duration(ev.LatencyNS))
		}
	case pMiss:
		c.noteCache(g, "miss")
		delete(c.regs, g)
		ev.Kind, ev.Op = "register", "miss"
		ev.Addr, ev.Len, ev.Bytes = a[rAX], a[rBX], int64(a[rBX])
	case pDeregister:
		ev.Kind, ev.Entry = "deregister", span(a[rCX], a[rDI])
		ev.Addr, ev.Len, ev.Bytes = a[rAX], a[rBX], int64(a[rBX])
	case pInvalidate:
		ev.Kind, ev.Entry = "invalidate", span(a[rAX], a[rBX])
		ev.Range = span(a[rCX], a[rDI])
		ev.Unmapped = a[rSI]&0xff != 0
		if sc, ok := c.cause(a[rCX], a[rDI]); ok {
			ev.Cause, ev.CauseTid = sc.Syscall.String(), sc.Tid
		}
	}
	return true
}

// nicEvent fills ev from a probe of the nic (PostSend, PostRecv and
// nic/trace.go) and reports whether it is an event.
func (c *correlator) nicEvent(r *record, ev *Event) bool {
	g, a := r.g, &r.regs
	switch r.probe {
	case pPostSend:
		id, ok1 := sendID.get(r)
		op, ok2 := sendOp.get(r)
		n, ok3 := sendLen.get(r)
		if ok1 && ok2 && ok3 {
			k := wrKey{a[rAX], id}
			c.wrs[k] = push(c.wrs[k], pendingWR{ts: r.ts, op: nic.Opcode(op), len: int64(n)})
			c.bound()
		}
		return false
	case pPostRecv:
		id, ok1 := recvID.get(r)
		n, ok2 := recvLen.get(r)
		if ok1 && ok2 {
			k := wrKey{a[rAX], id}
			c.recvs[k] = push(c.recvs[k], pendingWR{ts: r.ts, op: nic.OpRecv, len: int64(n)})
			c.bound()
		}
		return false
	case pSendDone:
		ev.Kind, ev.Op = "nic", nic.Opcode(a[rCX]&0xff).String()
		ev.QP, ev.WR = a[rAX], a[rBX]
		ev.Bytes = int64(a[rDI])
		ev.Status = nic.Status(a[rSI] & 0xff).String()
		if p, ok := pop(c.wrs, wrKey{ev.QP, ev.WR}); ok {
			ev.LatencyNS = int64(r.ts - p.ts)
			c.hists.add("nic "+ev.Op, time.Duration(ev.LatencyNS))
		}
	case pRecvDone:
		ev.Kind, ev.Op = "nic", nic.OpRecv.String()
		ev.QP, ev.WR = a[rAX], a[rBX]
		ev.Bytes = int64(a[rCX])
		ev.Status = nic.Status(a[rDI] & 0xff).String()
		if p, ok := pop(c.recvs, wrKey{ev.QP, ev.WR}); ok {
			ev.LatencyNS = int64(r.ts - p.ts)
			c.hists.add("nic recv", time.Duration(ev.LatencyNS))
		}
	case pNicRegister:
		if len(c.nregs) >= maxPending {
			clear(c.nregs)
		}
		c.nregs[g] = pendingReg{ts: r.ts, addr: a[rAX], len: a[rBX]}
		return false
	case pNicRegistered:
		ev.Kind, ev.Op = "nic", "register"
		ev.Addr, ev.Len, ev.Bytes = a[rAX], a[rBX], int64(a[rBX])
		ev.LKey, ev.RKey = a[rCX]&0xffffffff, a[rDI]
		if p, ok := c.nregs[g]; ok && p.addr == ev.Addr {
			delete(c.nregs, g)
			ev.Cache = p.cache
			ev.LatencyNS = int64(r.ts - p.ts)
			op := "nic register"
			if p.cache != "" {
				op += " (cache " + p.cache + ")"
			}
			c.hists.add(op, time.Duration(ev.LatencyNS))
		}
	}
	return true
}

// socketsEvent fills ev from a probe of sockets (Read, Write and
// sockets/trace.go) and reports whether it is an event.
func (c *correlator) socketsEvent(r *record, ev *Event) bool {
	g, a := r.g, &r.regs
	switch r.probe {
	case pConnRead, pConnWrite:
		// Read(c, b []byte), Write(c, b []byte): RAX c, RBX b.ptr, RCX b.len.
		if len(c.io) >= maxPending {
			clear(c.io)
		}
		op := "read"
		if r.probe == pConnWrite {
			op = "write"
		}
		c.io[g] = pendingIO{ts: r.ts, conn: a[rAX], len: int64(a[rCX]), op: op}
		return false
	case pConnDone:
		ev.Kind, ev.Conn = "sockets", a[rAX]
		ev.Op = map[uint64]string{1: "read", 2: "write"}[a[rBX]&0xff]
		ev.Bytes = int64(a[rCX])
		ev.Failed = a[rDI] != 0
		if p, ok := c.io[g]; ok && p.conn == ev.Conn {
			delete(c.io, g)
			ev.Requested = p.len
			ev.LatencyNS = int64(r.ts - p.ts)
			c.hists.add("sockets "+ev.Op, time.Duration(ev.LatencyNS))
		}
	}
	return true
}

// noteCache records how the cache served the nic registration that
// goroutine g is making, if any.
func (c *correlator) noteCache(g uint64, how string) {
	if p, ok := c.nregs[g]; ok {
		p.cache = how
		c.nregs[g] = p
	}
}

// push appends p to a queue of pending requests, dropping the oldest
// when it is full.
func push(q []pendingWR, p pendingWR) []pendingWR {
	if len(q) >= maxPerWR {
		q = q[1:]
	}
	return append(q, p)
}

// pop takes the oldest pending request of key k.
func pop[K comparable](m map[K][]pendingWR, k K) (pendingWR, bool) {
	q := m[k]
	if len(q) == 0 {
		return pendingWR{}, false
	}
	if len(q) == 1 {
		delete(m, k)
	} else {
		m[k] = q[1:]
	}
	return q[0], true
}

// bound forgets every pending request when too many keys accumulate
// (requests whose end was never seen).
func (c *correlator) bound() {
	if len(c.wrs) > maxPending {
		clear(c.wrs)
	}
	if len(c.recvs) > maxPending {
		clear(c.recvs)
	}
}

// cause finds the latest system call seen that overlaps [lo, hi),
// draining the monitor first, and waiting for it a little when nothing
// matches: the target's own monitor and ours run at the same system call
// entry, in either order.
func (c *correlator) cause(lo, hi uint64) (bpfmon.Event, bool) {
	if c.mon == nil {
		return bpfmon.Event{}, false
	}
	deadline := time.Now().Add(10 * time.Millisecond)
	for {
		c.drainSyscalls()
		for i := len(c.recent) - 1; i >= 0; i-- {
			e := c.recent[i]
			s, l := uint64(e.Start), uint64(e.Length)
			if s < hi && lo < s+l {
				return e, true
			}
		}
		if c.mon.Wait(deadline) != nil {
			return bpfmon.Event{}, false
		}
	}
}

func (c *correlator) drainSyscalls() {
	c.mon.Drain(func(e bpfmon.Event) {
		if len(c.recent) >= maxRecent {
			c.recent = append(c.recent[:0], c.recent[maxRecent/2:]...)
		}
		c.recent = append(c.recent, e)
	})
}

// clock converts CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns) to wall
// time.
type clock struct {
	offset int64 // wall − monotonic, ns
}

func newClock(mono func() int64) *clock {
	return &clock{offset: time.Now().UnixNano() - mono()}
}

func (c *clock) wall(mono uint64) time.Time { return time.Unix(0, int64(mono)+c.offset) }
