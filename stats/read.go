package stats

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// Endpoint is a process that publishes statistics.
type Endpoint struct {
	PID     int
	Comm    string // its command name (/proc/PID/comm), printable; may be empty
	Address string // the abstract socket, "@sandirect-stats-PID"
}

// List returns the processes that publish statistics, by pid. It reads
// /proc/net/unix: endpoints are abstract sockets, which vanish with their
// process, so the list never holds a dead one for longer than the kernel
// takes to close its fds. It sees the processes of this network namespace.
func List() ([]Endpoint, error) {
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return nil, fmt.Errorf("stats: list endpoints: %w", err)
	}
	defer f.Close()
	pids, err := parseUnix(f)
	if err != nil {
		return nil, fmt.Errorf("stats: list endpoints: %w", err)
	}
	eps := make([]Endpoint, len(pids))
	for i, pid := range pids {
		eps[i] = Endpoint{PID: pid, Comm: comm(pid), Address: Address(pid)}
	}
	return eps, nil
}

// soAcceptCon is __SO_ACCEPTCON in the Flags column: a listening socket.
const soAcceptCon = 0x10000

// parseUnix returns the sorted, distinct pids of listening endpoints in a
// /proc/net/unix listing:
//
//	Num       RefCount Protocol Flags    Type St Inode Path
//	0000...: 00000002 00000000 00010000 0001 01 23456 @sandirect-stats-123
func parseUnix(r io.Reader) ([]int, error) {
	var pids []int
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 8 || !strings.HasPrefix(f[7], addrPrefix) {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil || flags&soAcceptCon == 0 {
			continue
		}
		pid, ok := parsePID(f[7][len(addrPrefix):])
		if ok && !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	slices.Sort(pids)
	return pids, nil
}

// parsePID accepts a canonical positive decimal that fits a pid.
func parsePID(s string) (int, bool) {
	if s == "" || len(s) > 10 || s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > 1<<22 {
		return 0, false
	}
	return n, true
}

// comm returns pid's command name with anything unprintable replaced.
func comm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	b = bytes.TrimRight(b, "\n")
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, string(b))
}

// Counter is one published value.
type Counter struct {
	Group string // such as "device/1"
	Name  string // such as "sends"
	Value uint64
}

// Snapshot is one consistent copy of a process's table.
type Snapshot struct {
	PID      int
	Time     time.Time     // when the process last refreshed the table
	Interval time.Duration // how often it refreshes
	Dropped  uint64        // counters it left out (bad names, or over MaxEntries)
	Counters []Counter     // in the order the process's sources emitted them
}

// Get returns the value of one counter.
func (s *Snapshot) Get(group, name string) (uint64, bool) {
	for _, c := range s.Counters {
		if c.Group == group && c.Name == name {
			return c.Value, true
		}
	}
	return 0, false
}

// Reader maps one process's table read-only. It is safe for concurrent use.
// Reading never disturbs the process: it neither locks nor writes anything
// the process uses.
type Reader struct {
	pid  int
	proc *os.Process // a pidfd where the kernel has them: tells of its exit

	mu     lockrank.Mutex // guards seg, mem, closed; a leaf
	seg    *shm.Segment
	mem    []byte
	closed bool
}

// Open connects to pid's endpoint, checks that the process listening there
// is pid (SO_PEERCRED), receives its table's fd and maps it read-only. It
// fails with an error matching ErrNotFound when pid publishes nothing,
// os.ErrPermission when its owner refuses us (another uid, and we are not
// root), ErrCorrupt for an endpoint or table that breaks the protocol.
func Open(pid int) (*Reader, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("%w: pid %d", ErrNotFound, pid)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return nil, fmt.Errorf("%w: pid %d: %v", ErrNotFound, pid, err)
	}
	seg, mem, err := fetch(pid)
	if err != nil {
		proc.Release()
		return nil, err
	}
	r := &Reader{pid: pid, proc: proc, seg: seg, mem: mem}
	r.mu.Init(lockrank.StatsReader)
	return r, nil
}

// fetch receives and maps pid's current table.
func fetch(pid int) (*shm.Segment, []byte, error) {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.Dial("unix", Address(pid))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, nil, fmt.Errorf("%w for pid %d", ErrNotFound, pid)
		}
		return nil, nil, fmt.Errorf("stats: pid %d: %w", pid, err)
	}
	uc := c.(*net.UnixConn)
	defer uc.Close()
	uc.SetDeadline(time.Now().Add(2 * time.Second))
	// Anyone can bind any abstract name: make sure it is pid's.
	owner, _, _, err := sys.PeerCred(uc)
	if err != nil {
		return nil, nil, fmt.Errorf("stats: pid %d: peer credentials: %w", pid, err)
	}
	if int(owner) != pid {
		return nil, nil, fmt.Errorf("%w: %s is held by pid %d, not %d", ErrCorrupt, Address(pid), owner, pid)
	}
	buf := make([]byte, maxHello)
	n, fds, err := shm.ReceiveFds(uc, buf, 1)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("%w: pid %d closed its endpoint", ErrGone, pid)
		}
		return nil, nil, fmt.Errorf("stats: pid %d: %w", pid, err)
	}
	switch msg := string(buf[:n]); {
	case msg == helloDenied && len(fds) == 0:
		return nil, nil, fmt.Errorf("stats: pid %d: %w (its owner is another user)", pid, os.ErrPermission)
	case msg != helloOK || len(fds) != 1:
		shm.CloseFds(fds)
		return nil, nil, fmt.Errorf("%w: pid %d sent %q with %d fds", ErrCorrupt, pid, msg, len(fds))
	}
	seg, err := shm.OpenSegmentReadOnly(fds[0], KindStats, tabHeaderOff+entriesOff)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: pid %d: %w", ErrCorrupt, pid, err)
	}
	mem, err := seg.Region(tabHeaderOff, seg.Size()-tabHeaderOff)
	if err != nil {
		seg.Close()
		return nil, nil, fmt.Errorf("%w: pid %d: %w", ErrCorrupt, pid, err)
	}
	return seg, mem, nil
}

// PID returns the process the reader reads.
func (r *Reader) PID() int { return r.pid }

// busyTimeout bounds how long Snapshot retries a table that stays in the
// middle of an update (an owner that died while writing).
const busyTimeout = time.Second

// Snapshot returns a consistent copy of the table: it retries while the
// owner is writing, and fetches the table again if the owner replaced it
// (grown). It returns an error matching ErrGone once the process has exited
// or stopped publishing, ErrBusy if no consistent copy could be taken within
// a second, ErrCorrupt if the table breaks the layout.
func (r *Reader) Snapshot() (Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return Snapshot{}, ErrClosed
	}
	for range 4 {
		if r.exited() {
			return Snapshot{}, fmt.Errorf("%w: pid %d exited", ErrGone, r.pid)
		}
		s, state, err := readStable(r.mem)
		if err != nil {
			return Snapshot{}, fmt.Errorf("pid %d: %w", r.pid, err)
		}
		switch state {
		case stateLive:
			s.PID = r.pid
			return s, nil
		case stateClosed:
			return Snapshot{}, fmt.Errorf("%w: pid %d stopped publishing", ErrGone, r.pid)
		case stateReplaced:
			seg, mem, err := fetch(r.pid)
			if err != nil {
				if errors.Is(err, ErrNotFound) {
					err = fmt.Errorf("%w: pid %d stopped publishing", ErrGone, r.pid)
				}
				return Snapshot{}, err
			}
			r.seg.Close()
			r.seg, r.mem = seg, mem
		default:
			return Snapshot{}, fmt.Errorf("%w: pid %d: state %d", ErrCorrupt, r.pid, state)
		}
	}
	return Snapshot{}, fmt.Errorf("%w: pid %d keeps replacing its table", ErrBusy, r.pid)
}

// exited tells whether the process has exited: reaped (the pidfd says so),
// or a zombie its parent has not reaped yet (its table would otherwise look
// alive for ever).
func (r *Reader) exited() bool {
	if errors.Is(r.proc.Signal(syscall.Signal(0)), os.ErrProcessDone) {
		return true
	}
	// The pid cannot be reused while the zombie exists, nor while the
	// pidfd above says the process lives: /proc/PID is still ours.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(r.pid) + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// "PID (COMM) STATE …", where COMM may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st == 'Z' || st == 'X'
}

// readStable decodes mem, retrying torn copies for up to busyTimeout: first
// yielding, then sleeping briefly (the owner writes for microseconds every
// interval, so a retry nearly always succeeds at once).
func readStable(mem []byte) (Snapshot, uint32, error) {
	var deadline time.Time
	for i := 0; ; i++ {
		s, state, err := decode(mem)
		if err != errTorn {
			return s, state, err
		}
		switch {
		case i < 16:
			runtime.Gosched()
			continue
		case deadline.IsZero():
			deadline = time.Now().Add(busyTimeout)
		case time.Now().After(deadline):
			return s, state, fmt.Errorf("%w: no consistent copy in %v", ErrBusy, busyTimeout)
		}
		time.Sleep(100 * time.Microsecond) // back off: the owner may be preempted mid-update
	}
}

// Close unmaps the table. It is idempotent.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	r.proc.Release()
	return r.seg.Close()
}
