package bpfmon

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"

	"github.com/sandirect/sandirect/internal/feature"
	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
)

// The state value (struct state in bpf/bpfmon.c): words the probes bump on
// the first 64-byte line, words user space sets on the next.
const (
	stateEpoch     = 0  // bumped once per event, delivered or lost
	stateOverflow  = 8  // events lost since last cleared
	stateLostEpoch = 16 // epoch of the last lost event
	stateWatchAll  = 64 // non-zero: ignore the granule map
	stateWaiters   = 72 // Waits asleep on the ring: the probes wake them
	stateSize      = 128
)

// GranuleShift is log2 of the watch granule: Watch marks 2 MiB granules.
const GranuleShift = 21

// Monitor is a set of attached probes and the reader of their events. It is
// safe for concurrent use (see the package documentation).
type Monitor struct {
	method  Method
	reasons []string

	// lifeMu guards the mappings and maps against Close: every method that
	// touches them holds it for reading, Close for writing. Lock order:
	// lifeMu, then drainMu or ctlMu.
	lifeMu lockrank.RWMutex
	closed bool // guarded by lifeMu

	links    []link.Link
	events   *ebpf.Map
	state    *ebpf.Map
	pids     *ebpf.Map
	granules *ebpf.Map

	statePage []byte  // the mapped state array; replaced, never unmapped, at Close
	epoch     *uint64 // in statePage
	overflow  *uint64
	lostEpoch *uint64
	watchAll  *uint64
	waiters   *uint64

	drainMu lockrank.Mutex // guards the ring's consumer position
	ring    *ring
	synced  atomic.Uint64

	waitFile *os.File // a non-blocking dup of the ring buffer fd, in Go's poller
	waitConn syscall.RawConn
	closing  atomic.Bool // set by Close before it closes waitFile

	ctlMu       lockrank.Mutex    // guards granuleRefs and the updates of pids and granules
	granuleRefs map[uint64]uint32 // watched granule → Watch count
	maxGranules int
}

type mapObjs struct {
	Events   *ebpf.Map `ebpf:"events"`
	State    *ebpf.Map `ebpf:"state"`
	Pids     *ebpf.Map `ebpf:"pids"`
	Granules *ebpf.Map `ebpf:"granules"`
}

func (o *mapObjs) close() {
	for _, m := range []*ebpf.Map{o.Events, o.State, o.Pids, o.Granules} {
		if m != nil {
			m.Close()
		}
	}
}

// Programs of each method, in bpf/bpfmon.c, and what they attach to.
var methodPrograms = map[Method][]struct{ prog, target string }{
	TpBtf:         {{"tpbtf_sys_enter", "sys_enter"}},
	RawTracepoint: {{"rawtp_sys_enter", "sys_enter"}},
	Tracepoint: {
		{"tp_munmap", "sys_enter_munmap"}, {"tp_mremap", "sys_enter_mremap"},
		{"tp_madvise", "sys_enter_madvise"}, {"tp_brk", "sys_enter_brk"},
		{"tp_mmap", "sys_enter_mmap"}, {"tp_shmdt", "sys_enter_shmdt"},
	},
	Kprobe: {
		{"kp_munmap", "__x64_sys_munmap"}, {"kp_mremap", "__x64_sys_mremap"},
		{"kp_madvise", "__x64_sys_madvise"}, {"kp_brk", "__x64_sys_brk"},
		{"kp_mmap", "__x64_sys_mmap"}, {"kp_shmdt", "__x64_sys_shmdt"},
	},
}

// Open loads the programs, attaches them by the first method of
// cfg.Methods that works, and watches the calling process unless
// cfg.ExcludeSelf. A nil cfg means the defaults. When no method works the
// error matches ErrNotSupported and names what is missing.
func Open(cfg *Config) (*Monitor, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	if runtime.GOARCH != "amd64" {
		return nil, feature.Unsupported("bpfmon on "+runtime.GOARCH, "", errors.New("the programs are x86_64 only"))
	}
	spec, err := loadBpfmon()
	if err != nil {
		return nil, err
	}
	spec.Maps["events"].MaxEntries = uint32(c.RingSize)
	spec.Maps["pids"].MaxEntries = uint32(c.MaxPids)
	spec.Maps["granules"].MaxEntries = uint32(c.MaxGranules)
	if err := setVariables(spec); err != nil {
		return nil, err
	}

	var maps mapObjs
	if err := spec.LoadAndAssign(&maps, nil); err != nil {
		return nil, mapError(err)
	}
	m := &Monitor{
		events: maps.Events, state: maps.State, pids: maps.Pids, granules: maps.Granules,
		granuleRefs: make(map[uint64]uint32), maxGranules: c.MaxGranules,
	}
	m.lifeMu.Init(lockrank.MonitorLife)
	m.drainMu.Init(lockrank.MonitorDrain)
	m.ctlMu.Init(lockrank.MonitorCtl)
	ok := false
	defer func() {
		if !ok {
			m.closeAll()
		}
	}()
	if err := m.mapMemory(c.RingSize); err != nil {
		return nil, err
	}

	opts := ebpf.CollectionOptions{
		MapReplacements: map[string]*ebpf.Map{
			"events": m.events, "state": m.state, "pids": m.pids, "granules": m.granules,
		},
		Cache: btf.NewCache(),
	}
	var missing []string
	for _, meth := range c.Methods {
		links, err := attach(spec, meth, &opts)
		if err == nil {
			m.method, m.links = meth, links
			break
		}
		m.reasons = append(m.reasons, fmt.Sprintf("%s: %v", meth, err))
		missing = append(missing, string(meth))
	}
	if m.links == nil {
		return nil, feature.Unsupported("eBPF syscall probes ("+strings.Join(missing, ", ")+")", "",
			errors.New(strings.Join(m.reasons, "; ")))
	}
	if c.WatchAll {
		m.WatchAll(true)
	}
	if !c.ExcludeSelf {
		if err := m.AddPid(os.Getpid()); err != nil {
			return nil, err
		}
	}
	ok = true
	return m, nil
}

// testNoFindVma makes Open load the programs as if the kernel lacked
// bpf_find_vma (tests of the shmdt fallback).
var testNoFindVma bool

// setVariables fills in the .rodata constants of the programs.
func setVariables(spec *ebpf.CollectionSpec) error {
	set := func(name string, v any) error {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("bpfmon: object lacks variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("bpfmon: set %s: %w", name, err)
		}
		return nil
	}
	if err := set("page_size", uint64(os.Getpagesize())); err != nil {
		return err
	}
	// Thread and process ids as this process sees them: in its pid
	// namespace, named by the device and inode of /proc/self/ns/pid. In the
	// initial namespace (PROC_PID_INIT_INO) the global ids are the same
	// and cheaper to get: bpf_get_ns_current_pid_tgid costs about a
	// third of a program run.
	const procPidInitIno = 0xEFFFFFFC
	if fi, err := os.Stat("/proc/self/ns/pid"); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Ino != procPidInitIno {
			if err := set("pidns_dev", uint64(st.Dev)); err != nil {
				return err
			}
			if err := set("pidns_ino", st.Ino); err != nil {
				return err
			}
		}
	}
	var findVma uint32
	if !testNoFindVma && features.HaveProgramHelper(ebpf.Kprobe, asm.FnFindVma) == nil {
		findVma = 1
	}
	return set("have_find_vma", findVma)
}

// mapError explains why the maps could not be created.
func mapError(err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) {
		return feature.Unsupported("BPF ring buffer and mmapable array", "5.8", err)
	}
	if errors.Is(err, os.ErrPermission) {
		what := "bpf(2) for this process"
		if !sys.HasCap(sys.CapBPF) && !sys.HasCap(sys.CapSysAdmin) {
			what = "CAP_BPF (or CAP_SYS_ADMIN)"
			// The missing capability is the cause: cilium/ebpf's hint
			// at RLIMIT_MEMLOCK, which it adds to every EPERM, is not.
			var errno syscall.Errno
			if errors.As(err, &errno) {
				err = errno
			}
		}
		return feature.Unsupported(what, "", fmt.Errorf("creating BPF maps: %w (unprivileged, lockdown, or kernel.unprivileged_bpf_disabled)", err))
	}
	return fmt.Errorf("bpfmon: create maps: %w", err)
}

// attach loads the programs of method meth and attaches them; all or none.
func attach(spec *ebpf.CollectionSpec, meth Method, opts *ebpf.CollectionOptions) (links []link.Link, err error) {
	progs := methodPrograms[meth]
	if meth == Tracepoint {
		if err := ensureTracefs(); err != nil {
			return nil, err
		}
	}
	s := spec.Copy()
	for name := range s.Programs {
		keep := false
		for _, p := range progs {
			keep = keep || p.prog == name
		}
		if !keep {
			delete(s.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(s, *opts)
	if err != nil {
		return nil, fmt.Errorf("load: %w", shortVerifierError(err))
	}
	// The links hold the programs; the collection (clones of our maps
	// and the .rodata map, which the programs hold) can go.
	defer coll.Close()
	defer func() {
		if err != nil {
			for _, l := range links {
				l.Close()
			}
			links = nil
		}
	}()
	for _, p := range progs {
		prog := coll.Programs[p.prog]
		var l link.Link
		switch meth {
		case TpBtf:
			l, err = link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
		case RawTracepoint:
			l, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: p.target, Program: prog})
		case Tracepoint:
			l, err = link.Tracepoint("syscalls", p.target, prog, nil)
		case Kprobe:
			l, err = link.Kprobe(p.target, prog, nil)
		}
		if err != nil {
			return links, fmt.Errorf("attach %s: %w", p.target, err)
		}
		links = append(links, l)
	}
	return links, nil
}

// shortVerifierError keeps a verifier log's last lines: the reason.
func shortVerifierError(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) && len(ve.Log) > 4 {
		return fmt.Errorf("%w (log tail: %s)", ve.Cause, strings.Join(ve.Log[len(ve.Log)-4:], " | "))
	}
	return err
}

// tracefsDir is where Open mounts tracefs when it is mounted nowhere.
const tracefsDir = "/sys/kernel/tracing"

// ensureTracefs makes sure tracefs is mounted where cilium/ebpf looks for it,
// mounting it at /sys/kernel/tracing when the process is root.
func ensureTracefs() error {
	for _, dir := range []string{tracefsDir, "/sys/kernel/debug/tracing"} {
		if t, err := sys.FsType(dir); err == nil && t == sys.TracefsMagic {
			return nil
		}
	}
	if _, err := os.Stat(tracefsDir); err != nil {
		return feature.Unsupported("tracefs", "4.1", err)
	}
	if err := sys.MountTracefs(tracefsDir); err != nil {
		return feature.Unsupported("tracefs", "4.1", fmt.Errorf("not mounted, and mount at %s failed: %w", tracefsDir, err))
	}
	return nil
}

// mapMemory maps the state array and the ring buffer.
func (m *Monitor) mapMemory(ringSize int) error {
	page := os.Getpagesize()
	b, err := sys.MapFd(m.state.FD(), 0, page, true)
	if err != nil {
		return fmt.Errorf("bpfmon: map state array: %w", err)
	}
	m.statePage = b
	for _, w := range []struct {
		p   **uint64
		off int
	}{{&m.epoch, stateEpoch}, {&m.overflow, stateOverflow}, {&m.lostEpoch, stateLostEpoch}, {&m.watchAll, stateWatchAll}, {&m.waiters, stateWaiters}} {
		if *w.p, err = sys.Word64(b, w.off); err != nil {
			return err
		}
	}
	if m.ring, err = newRing(m.events.FD(), ringSize); err != nil {
		return err
	}
	fd, err := sys.Dup(m.events.FD())
	if err != nil {
		return fmt.Errorf("bpfmon: dup ring buffer fd: %w", err)
	}
	if err := sys.SetNonblock(fd); err != nil {
		sys.Close(fd)
		return fmt.Errorf("bpfmon: ring buffer fd: %w", err)
	}
	m.waitFile = os.NewFile(uintptr(fd), "bpfmon-ringbuf")
	if m.waitConn, err = m.waitFile.SyscallConn(); err != nil {
		return fmt.Errorf("bpfmon: ring buffer fd: %w", err)
	}
	return nil
}

// Method returns the attach method in use.
func (m *Monitor) Method() Method { return m.method }

// Reasons returns why the methods tried before the one in use failed, one
// "method: reason" line each.
func (m *Monitor) Reasons() []string { return append([]string(nil), m.reasons...) }

// EpochWord returns the epoch word in the mapped BPF array, for callers that
// compare it with sync/atomic.LoadUint64 themselves. It stays readable after
// Close.
func (m *Monitor) EpochWord() *uint64 { return m.epoch }

// Epoch returns the epoch: the number of events reported so far, delivered
// or lost. One atomic load.
func (m *Monitor) Epoch() uint64 { return atomic.LoadUint64(m.epoch) }

// Synced returns the highest epoch a Sync has brought its caller up to.
func (m *Monitor) Synced() uint64 { return m.synced.Load() }

// Overflowed tells whether events were lost to a full ring since the
// overflow was last cleared (ClearOverflow, Sync).
func (m *Monitor) Overflowed() bool { return atomic.LoadUint64(m.overflow) != 0 }

// ClearOverflow clears the overflow word and returns how many events were
// lost since it was last cleared.
func (m *Monitor) ClearOverflow() uint64 { return atomic.SwapUint64(m.overflow, 0) }

// WatchAll makes the probes report every range of the watched processes
// (on) or only ranges that overlap watched granules (off).
func (m *Monitor) WatchAll(on bool) {
	var v uint64
	if on {
		v = 1
	}
	atomic.StoreUint64(m.watchAll, v)
}

// AddPid watches process tgid (in this process's pid namespace).
func (m *Monitor) AddPid(tgid int) error {
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	m.ctlMu.Lock()
	defer m.ctlMu.Unlock()
	if err := m.pids.Update(uint32(tgid), uint32(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpfmon: watch pid %d: %w", tgid, err)
	}
	return nil
}

// RemovePid stops watching process tgid.
func (m *Monitor) RemovePid(tgid int) error {
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	m.ctlMu.Lock()
	defer m.ctlMu.Unlock()
	if err := m.pids.Delete(uint32(tgid)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpfmon: unwatch pid %d: %w", tgid, err)
	}
	return nil
}

// granuleRange returns the granules [first, last] that [start, start+length)
// overlaps; ok is false for an empty or wrapping range.
func granuleRange(start, length uintptr) (first, last uint64, ok bool) {
	if length == 0 || start+length < start {
		return 0, 0, false
	}
	return uint64(start) >> GranuleShift, uint64(start+length-1) >> GranuleShift, true
}

// Watch adds one reference to every 2 MiB granule that [start,
// start+length) overlaps: events overlapping them are reported. It fails,
// changing nothing, when the granules would exceed Config.MaxGranules
// (syscall.ENOSPC; WatchAll is the way out).
func (m *Monitor) Watch(start, length uintptr) error {
	first, last, ok := granuleRange(start, length)
	if !ok {
		return fmt.Errorf("bpfmon: watch [%#x, +%#x): %w", start, length, syscall.EINVAL)
	}
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	m.ctlMu.Lock()
	defer m.ctlMu.Unlock()
	fresh := 0
	for g := first; g <= last; g++ {
		if m.granuleRefs[g] == 0 {
			fresh++
		}
	}
	if len(m.granuleRefs)+fresh > m.maxGranules {
		return fmt.Errorf("bpfmon: watch [%#x, +%#x): %d granules over the limit of %d: %w",
			start, length, len(m.granuleRefs)+fresh, m.maxGranules, syscall.ENOSPC)
	}
	for g := first; g <= last; g++ {
		if m.granuleRefs[g] == 0 {
			if err := m.granules.Update(g, uint32(1), ebpf.UpdateAny); err != nil {
				if g > first {
					m.unwatchLocked(first, g-1)
				}
				return fmt.Errorf("bpfmon: watch granule %#x: %w", g<<GranuleShift, err)
			}
		}
		m.granuleRefs[g]++
	}
	return nil
}

// Unwatch drops the references Watch(start, length) added.
func (m *Monitor) Unwatch(start, length uintptr) error {
	first, last, ok := granuleRange(start, length)
	if !ok {
		return fmt.Errorf("bpfmon: unwatch [%#x, +%#x): %w", start, length, syscall.EINVAL)
	}
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	m.ctlMu.Lock()
	defer m.ctlMu.Unlock()
	return m.unwatchLocked(first, last)
}

func (m *Monitor) unwatchLocked(first, last uint64) error {
	var errs []error
	for g := first; g <= last; g++ {
		switch m.granuleRefs[g] {
		case 0:
			continue
		case 1:
			delete(m.granuleRefs, g)
			if err := m.granules.Delete(g); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		default:
			m.granuleRefs[g]--
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bpfmon: unwatch: %w", err)
	}
	return nil
}

// Drain hands every event committed to the ring so far to fn, in ring
// order, without blocking and without system calls, and returns how many.
// It stops early at a record that is reserved but not yet submitted (Sync
// waits for those). fn runs with the consumer lock held: it must not call
// Drain or Sync.
func (m *Monitor) Drain(fn func(Event)) (int, error) {
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return 0, ErrClosed
	}
	m.drainMu.Lock()
	defer m.drainMu.Unlock()
	n, err := m.ring.read(fn)
	if err == errBusy {
		err = nil
	}
	return n, err
}

// Sync brings the caller up to date with the epoch it loads first: it
// hands to apply every event whose epoch is at or below it (waiting for
// records reserved but not yet submitted), calls flush (if not nil) when
// events were lost since the last Sync or ClearOverflow, and only then
// publishes the epoch (Synced) and returns it. A caller whose state was
// current at the returned epoch, with apply's and flush's effects, is
// current for every system call that returned before Sync was called.
// apply and flush run with the consumer lock held.
func (m *Monitor) Sync(apply func(Event), flush func()) (uint64, error) {
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return 0, ErrClosed
	}
	m.drainMu.Lock()
	defer m.drainMu.Unlock()
	// Every event at or below e was reserved before its epoch increment,
	// so it lies before the producer position loaded after e.
	e := atomic.LoadUint64(m.epoch)
	_, err := m.ring.readUntil(m.ring.producer(), apply)
	lost := atomic.SwapUint64(m.overflow, 0) != 0
	if err != nil {
		lost = true
	}
	if lost && flush != nil {
		flush()
	}
	if err != nil {
		return 0, err
	}
	for {
		old := m.synced.Load()
		if int64(e-old) <= 0 || m.synced.CompareAndSwap(old, e) {
			break
		}
	}
	return e, nil
}

// Wait blocks until the ring holds an event not yet drained, the deadline
// passes (os.ErrDeadlineExceeded; the zero time means none), or the Monitor
// is closed (ErrClosed). The ring buffer wakes a waiter only when it had
// drained everything, so call Wait after Drain or Sync. Meant for one
// background goroutine: concurrent Waits share one deadline.
func (m *Monitor) Wait(deadline time.Time) error {
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	err := m.waitFile.SetReadDeadline(deadline)
	if err == nil {
		// The probes wake the ring's readers only while one waits: say so
		// before looking for records (the probe loads the count after its
		// fully ordered epoch add, so one of us sees the other).
		atomic.AddUint64(m.waiters, 1)
		err = m.waitConn.Read(func(uintptr) bool { return m.ring.pending() })
		atomic.AddUint64(m.waiters, ^uint64(0))
	}
	// Close closes the file under us to interrupt the wait; the file
	// reports that in more than one way.
	if err != nil && (m.closing.Load() || errors.Is(err, os.ErrClosed)) {
		return ErrClosed
	}
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("bpfmon: wait: %w", err)
	}
	return err
}

// Close detaches the probes and releases the maps. The epoch word stays
// readable: its page is replaced by a private one holding the last epoch
// plus one and a set overflow word (one page stays mapped per closed
// Monitor). Close is idempotent.
func (m *Monitor) Close() error {
	// Interrupt a Wait first: it holds lifeMu for reading.
	m.closing.Store(true)
	m.waitFile.Close()
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return m.closeAll()
}

// closeAll releases everything; with Close's lock held, or on a Monitor
// that Open has not returned.
func (m *Monitor) closeAll() error {
	// One goroutine a link: each close waits for RCU grace periods (15-70
	// ms a tracepoint link here), and the waits overlap.
	errs := make([]error, len(m.links)+2)
	var wg sync.WaitGroup
	for i, l := range m.links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Close()
		}()
	}
	wg.Wait()
	m.links = nil
	if m.waitFile != nil {
		m.waitFile.Close()
	}
	if m.ring != nil {
		m.ring.close()
	}
	if m.statePage != nil {
		errs[len(errs)-1] = m.retireState()
	}
	(&mapObjs{m.events, m.state, m.pids, m.granules}).close()
	return errors.Join(errs...)
}

// retireState replaces the mapped state page by a private copy with the
// epoch moved once more and the overflow word set, atomically (mremap over
// it), so that EpochWord's pointer stays valid and a cache checking it
// flushes and finds the Monitor closed.
func (m *Monitor) retireState() error {
	page := uintptr(len(m.statePage))
	addr := sys.Addr(m.statePage)
	repl, err := sys.MmapAnon(0, page, 0)
	if err != nil {
		return fmt.Errorf("bpfmon: retire state page: %w", err)
	}
	b := sys.Bytes(repl, page)
	copy(b, m.statePage[:stateSize])
	e, _ := sys.Word64(b, stateEpoch)
	o, _ := sys.Word64(b, stateOverflow)
	*e = atomic.LoadUint64(m.epoch) + 1
	*o = 1
	if _, err := sys.Mremap(repl, page, page, sys.MremapMaymove|sys.MremapFixed, addr); err != nil {
		sys.MunmapRange(repl, page)
		return fmt.Errorf("bpfmon: retire state page: %w", err)
	}
	return nil
}

// EpochAtomic is EpochWord as a *atomic.Uint64, for callers that keep their
// epoch source in that type. Same word, same lifetime.
func (m *Monitor) EpochAtomic() *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(m.epoch))
}
