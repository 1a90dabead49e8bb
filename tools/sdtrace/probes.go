package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/sandirect/sandirect/internal/feature"
	"github.com/sandirect/sandirect/internal/sys"
)

// probeID numbers the traced functions; it travels in the attach cookie.
type probeID uint16

const (
	pRegister      probeID = iota + 1 // pin.(*Cache).RegisterFor
	pHit                              // pin.traceHit: RegisterFor found a cached entry
	pMiss                             // pin.traceMiss: RegisterFor pins and registers
	pDeregister                       // pin.traceDeregister
	pInvalidate                       // pin.traceInvalidate
	pPostSend                         // nic.(*QueuePair).PostSend
	pPostRecv                         // nic.(*QueuePair).PostRecv
	pSendDone                         // nic.traceSendDone: a send, RDMA Write or Read completes
	pRecvDone                         // nic.traceRecvDone: a message lands in a posted receive
	pConnRead                         // sockets.(*Conn).Read
	pConnWrite                        // sockets.(*Conn).Write
	pConnDone                         // sockets.traceIO: a Read or Write returns
	pNicRegister                      // nic.traceRegister: Register, RegisterRemote, RegisterFor begin
	pNicRegistered                    // nic.traceRegistered: the region is in the registration table
)

const modPath = "github.com/sandirect/sandirect/"

// probe is one traced function and what its registers hold at entry (Go's
// register ABI on amd64: integer arguments in RAX, RBX, RCX, RDI, RSI, R8,
// R9, R10, R11; a receiver first; a slice as pointer, length, capacity; a
// struct as its fields; an interface as type and data words). Each is an
// exported method, whose signature is the library's API, or a trace point:
// an empty go:noinline function with plain integer arguments that the
// library keeps stable for this table (pin/trace.go, nic/trace.go,
// sockets/trace.go). When one changes, the end-to-end test fails until
// this table follows.
type probe struct {
	id    probeID
	sym   string
	stack bool // copy the 64 bytes of stack arguments
}

var probes = []probe{
	// RegisterFor(c, owner Owner, buf []byte, access Access):
	// RAX c, RBX owner, RCX buf.ptr, RDI buf.len, RSI buf.cap, R8 access.
	{id: pRegister, sym: "pin.(*Cache).RegisterFor"},
	// traceHit(addr uintptr, n int, lo, hi uintptr): the buffer in RAX,
	// RBX; the entry [lo, hi) in RCX, RDI.
	{id: pHit, sym: "pin.traceHit"},
	// traceMiss(addr uintptr, n int): RAX, RBX.
	{id: pMiss, sym: "pin.traceMiss"},
	// traceDeregister(addr uintptr, n int, lo, hi uintptr): as traceHit.
	{id: pDeregister, sym: "pin.traceDeregister"},
	// traceInvalidate(lo, hi, slo, shi uintptr, unmapped bool): the entry
	// in RAX, RBX; the range changing in RCX, RDI; RSI unmapped.
	{id: pInvalidate, sym: "pin.traceInvalidate"},
	// PostSend(qp, wr SendWR), PostRecv(qp, wr RecvWR): RAX qp; wr in the
	// registers after it or, when it does not fit, on the stack (abi.go).
	{id: pPostSend, sym: "nic.(*QueuePair).PostSend", stack: true},
	{id: pPostRecv, sym: "nic.(*QueuePair).PostRecv", stack: true},
	// traceSendDone(qp, id uint64, op Opcode, bytes int, st Status):
	// RAX qp, RBX id, RCX op, RDI bytes, RSI st. Every send, RDMA Write
	// and RDMA Read ends there, unsignaled ones too.
	{id: pSendDone, sym: "nic.traceSendDone"},
	// traceRecvDone(qp, id uint64, bytes int, st Status): RAX qp, RBX id,
	// RCX bytes, RDI st.
	{id: pRecvDone, sym: "nic.traceRecvDone"},
	// Read(c, b []byte), Write(c, b []byte): RAX c, RBX b.ptr, RCX b.len.
	{id: pConnRead, sym: "sockets.(*Conn).Read"},
	{id: pConnWrite, sym: "sockets.(*Conn).Write"},
	// traceIO(c, op ioOp, n int, err error): RAX c, RBX op, RCX n, RDI:RSI err.
	{id: pConnDone, sym: "sockets.traceIO"},
	// traceRegister(addr uintptr, n int): RAX addr, RBX n; the cache's
	// RegisterFor runs next, then, on success, traceRegistered(addr
	// uintptr, n int, lkey uint32, rkey uint64): RAX addr, RBX n, RCX
	// lkey, RDI rkey.
	{id: pNicRegister, sym: "nic.traceRegister"},
	{id: pNicRegistered, sym: "nic.traceRegistered"},
}

// uprobes is the set of attached uprobes and the reader of their ring.
type uprobes struct {
	coll     *ebpf.Collection
	links    []link.Link
	rd       *ringbuf.Reader
	attached []string // the probes' symbols, without modPath
	missing  []string // symbols the binary lacks
}

// errNoSymbols: the target has none of the library's functions.
var errNoSymbols = errors.New("no sandirect functions in the binary")

// attachUprobes loads the program and attaches it at the entry of every
// function of probes that exe has, for process pid only.
func attachUprobes(exe string, pid, ringSize int) (_ *uprobes, err error) {
	spec, err := loadSdtrace()
	if err != nil {
		return nil, err
	}
	spec.Maps["events"].MaxEntries = uint32(ringSize)
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return nil, loadError(err)
	}
	u := &uprobes{coll: coll}
	defer func() {
		if err != nil {
			u.close()
		}
	}()
	ex, err := link.OpenExecutable(exe)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", exe, err)
	}
	var names []string
	for _, p := range probes {
		names = append(names, modPath+p.sym)
	}
	offs, err := funcOffsets(exe, names)
	if err != nil {
		return nil, err
	}
	prog := coll.Programs["go_entry"]
	for _, p := range probes {
		cookie := uint64(p.id)
		if p.stack {
			cookie |= cookieStack
		}
		off, ok := offs[modPath+p.sym]
		if !ok {
			u.missing = append(u.missing, p.sym)
			continue
		}
		l, err := ex.Uprobe(modPath+p.sym, prog, &link.UprobeOptions{Address: off, PID: pid, Cookie: cookie})
		if err != nil {
			return nil, uprobeError(p.sym, err)
		}
		u.links = append(u.links, l)
		u.attached = append(u.attached, p.sym)
	}
	if len(u.links) == 0 {
		return nil, fmt.Errorf("%s: %w (looked for %s…)", exe, errNoSymbols, modPath)
	}
	if u.rd, err = ringbuf.NewReader(coll.Maps["events"]); err != nil {
		return nil, fmt.Errorf("ring buffer reader: %w", err)
	}
	return u, nil
}

// lost returns the records lost to a full ring so far.
func (u *uprobes) lost() uint64 {
	var n uint64
	if err := u.coll.Maps["lost"].Lookup(uint32(0), &n); err != nil {
		return 0
	}
	return n
}

func (u *uprobes) close() {
	if u.rd != nil {
		u.rd.Close()
	}
	for _, l := range u.links {
		l.Close()
	}
	u.coll.Close()
}

// loadError explains why the program could not be loaded.
func loadError(err error) error {
	if errors.Is(err, os.ErrPermission) {
		what := "bpf(2) for this process"
		if !sys.HasCap(sys.CapBPF) && !sys.HasCap(sys.CapSysAdmin) {
			what = "CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN, or root)"
		}
		return feature.Unsupported(what, "", fmt.Errorf("loading the uprobe program: %w", err))
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return feature.Unsupported("BPF ring buffer", "5.8", err)
	}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) && len(ve.Log) > 2 {
		return fmt.Errorf("load uprobe program: %w (log tail: %s)", ve.Cause, strings.Join(ve.Log[len(ve.Log)-2:], " | "))
	}
	return fmt.Errorf("load uprobe program: %w", err)
}

// uprobeError explains why a uprobe could not be attached.
func uprobeError(sym string, err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, ebpf.ErrNotSupported):
		// No uprobe PMU (/sys/bus/event_source/devices/uprobe) and no
		// tracefs uprobe_events, or no attach cookies (Linux 5.15).
		return feature.Unsupported("uprobes with attach cookies", "5.15", fmt.Errorf("%s: %w", sym, err))
	case errors.Is(err, os.ErrPermission):
		return feature.Unsupported("CAP_PERFMON (or CAP_SYS_ADMIN, or root)", "", fmt.Errorf("uprobe on %s: %w", sym, err))
	}
	return fmt.Errorf("uprobe on %s: %w", sym, err)
}
