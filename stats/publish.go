package stats

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// addrPrefix starts the abstract socket name of every endpoint; the pid
// follows in decimal.
const addrPrefix = "@sandirect-stats-"

// Address returns the abstract Unix socket name of pid's endpoint,
// "@sandirect-stats-PID".
func Address(pid int) string { return addrPrefix + strconv.Itoa(pid) }

// The endpoint's one message, sent with the segment fd (or without one,
// after a refused credentials check). The version is the table's.
const (
	helloOK     = "sandirect-stats 1\n"
	helloDenied = "sandirect-stats 1 denied\n"
	maxHello    = 64
)

// Register publishes the counters of one group (such as "device/1" or
// "conn/7": 1 to MaxGroupLen bytes of [A-Za-z0-9_./:-]; it panics on an
// invalid group). While any source is registered the process publishes a
// statistics table; every refresh calls snapshot, on the publisher's
// goroutine, which calls emit once per counter. Names follow the rules of
// groups with MaxNameLen bytes; a counter with an invalid name is left out
// and counted as dropped.
//
// snapshot must be quick and must not block for long: it runs with the
// publisher's lock held. emit is valid only during the call. The snapshot
// of one source is never called concurrently with itself.
//
// unregister removes the source. When it returns, snapshot is not running
// and will not be called again; when the last source goes, so do the
// goroutine, the socket and the segment. unregister is idempotent; it must
// not be called from inside a snapshot, nor while holding a lock that a
// snapshot takes.
func Register(group string, snapshot func(emit func(name string, v uint64))) (unregister func()) {
	if !validName(group, MaxGroupLen) {
		panic(fmt.Sprintf("stats: invalid group %q", group))
	}
	if snapshot == nil {
		panic("stats: nil snapshot")
	}
	var outer func(group, name string, v uint64) // set by each refresh, under the publisher's lock
	inner := func(name string, v uint64) { outer(group, name, v) }
	return RegisterGroups(func(emit func(group, name string, v uint64)) {
		outer = emit
		snapshot(inner)
	})
}

// RegisterGroups is Register for a source that publishes several groups,
// such as a device and each of its queue pairs ("device/1",
// "device/1/qp/3"). A counter with an invalid group or name is left out and
// counted as dropped.
func RegisterGroups(snapshot func(emit func(group, name string, v uint64))) (unregister func()) {
	if snapshot == nil {
		panic("stats: nil snapshot")
	}
	s := &source{fn: snapshot}
	pub.runMu.Lock()
	pub.mu.Lock()
	pub.sources = append(pub.sources, s)
	pub.mu.Unlock()
	pub.reconcile()
	pub.runMu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { pub.remove(s) }) }
}

// Configure replaces the publisher's configuration (nil: DefaultConfig). A
// new interval applies from the next refresh; Disable stops publishing at
// once (sources stay registered) and clearing it starts again.
func Configure(cfg *Config) error {
	c := DefaultConfig()
	if cfg != nil {
		c = *cfg
	}
	if err := c.Validate(); err != nil {
		return err
	}
	pub.runMu.Lock()
	defer pub.runMu.Unlock()
	pub.mu.Lock()
	pub.initLocked()
	pub.cfg = c
	r := pub.run
	pub.mu.Unlock()
	if r != nil {
		r.kick() // apply the new interval now
	}
	pub.reconcile()
	return nil
}

// Err returns what keeps the process from publishing, or nil: a bad
// environment variable, or the last failure to create the segment or the
// socket (retried at the next Register or Configure) or to grow the table.
func Err() error {
	pub.mu.Lock()
	defer pub.mu.Unlock()
	return errors.Join(pub.envErr, pub.runErr)
}

type source struct {
	fn func(emit func(group, name string, v uint64))
}

// publisher is the process-wide state behind Register. Lock order: runMu,
// then mu, then the locks snapshots take; a run's tabMu comes after runMu
// (a run that grows its table on starting) and is never held with mu.
type publisher struct {
	runMu lockrank.Mutex // serializes starting and stopping run

	mu      lockrank.Mutex // guards the fields below; held while snapshots run
	sources []*source      // in registration order
	inited  bool           // cfg and envErr are set
	cfg     Config
	envErr  error
	runErr  error
	run     *run // non-nil while publishing; written under runMu and mu
}

var pub publisher

func init() {
	pub.runMu.Init(lockrank.StatsRun)
	pub.mu.Init(lockrank.Stats)
}

func (p *publisher) initLocked() {
	if !p.inited {
		p.cfg, p.envErr = envConfig()
		p.inited = true
	}
}

func (p *publisher) remove(s *source) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	p.mu.Lock() // waits for a refresh that may be calling s
	for i, o := range p.sources {
		if o == s {
			p.sources = append(p.sources[:i], p.sources[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	p.reconcile()
}

// reconcile starts or stops publishing to match the sources and the
// configuration. runMu is held. A running publisher is not asked to
// refresh early: a new source shows at the next interval, so that a
// process registering thousands of sources (one per connection) does not
// rewrite the table thousands of times.
func (p *publisher) reconcile() {
	p.mu.Lock()
	p.initLocked()
	want := len(p.sources) > 0 && !p.cfg.Disable
	r := p.run
	interval := p.cfg.Interval
	p.mu.Unlock()
	switch {
	case want && r == nil:
		r, err := startRun(p, interval)
		p.mu.Lock()
		p.run, p.runErr = r, err
		p.mu.Unlock()
	case !want && r != nil:
		p.mu.Lock()
		p.run = nil
		p.mu.Unlock()
		r.shutdown()
	}
}

// run is one publishing period: a table, the endpoint socket and the two
// goroutines that serve them.
type run struct {
	p     *publisher
	ln    *net.UnixListener
	euid  uint32
	tabMu lockrank.Mutex // guards tab; the accept loop sends its fd under it
	tab   *table         // replaced only by the refreshing goroutine
	buf   []entry        // the refresh being built; used only by refresh
	bad   uint64         // counters refused in this refresh
	emit  func(group, name string, v uint64)
	poke  chan struct{}
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startRun(p *publisher, interval time.Duration) (*run, error) {
	tab, err := newTable(minEntries, interval)
	if err != nil {
		return nil, fmt.Errorf("stats: create table: %w", err)
	}
	r := &run{
		p:    p,
		euid: uint32(os.Geteuid()),
		tab:  tab,
		poke: make(chan struct{}, 1),
		stop: make(chan struct{}),
	}
	r.tabMu.Init(lockrank.StatsTable)
	r.emit = r.add
	r.refresh() // the table has contents before anyone can fetch it
	addr := Address(os.Getpid())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		r.tab.close()
		return nil, fmt.Errorf("stats: listen on %s: %w", addr, err)
	}
	r.ln = ln
	r.wg.Add(2)
	go r.refreshLoop(interval)
	go r.acceptLoop()
	return r, nil
}

// kick has the refreshing goroutine refresh now.
func (r *run) kick() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

func (r *run) shutdown() {
	close(r.stop)
	r.ln.Close()
	r.wg.Wait()
	r.tab.setState(stateClosed)
	r.tab.close()
}

func (r *run) refreshLoop(interval time.Duration) {
	defer r.wg.Done()
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		case <-r.poke:
		}
		t.Reset(r.refresh())
	}
}

// add is the emit function handed to snapshots; the publisher's lock is
// held.
func (r *run) add(group, name string, v uint64) {
	if !validName(group, MaxGroupLen) || !validName(name, MaxNameLen) {
		r.bad++
		return
	}
	r.buf = append(r.buf, entry{group: group, name: name, value: v})
}

// refresh collects every source's counters and rewrites the table. It
// returns the interval until the next refresh.
func (r *run) refresh() time.Duration {
	p := r.p
	p.mu.Lock()
	r.buf, r.bad = r.buf[:0], 0
	for _, s := range p.sources {
		s.fn(r.emit)
	}
	interval := p.cfg.Interval
	p.mu.Unlock()
	now := time.Now()
	if len(r.buf) > r.tab.capacity && r.tab.capacity < MaxEntries {
		if err := r.grow(now, interval); err == nil {
			return interval
		}
	}
	r.tab.write(r.buf, now, interval, r.bad)
	return interval
}

// grow moves to a table with room for this refresh and half as much again,
// and tells readers of the old one to fetch the new one.
func (r *run) grow(now time.Time, interval time.Duration) error {
	nt, err := newTable(len(r.buf)+len(r.buf)/2, interval)
	if err != nil {
		r.p.mu.Lock()
		r.p.runErr = fmt.Errorf("stats: grow table to %d entries: %w", len(r.buf), err)
		r.p.mu.Unlock()
		return err
	}
	nt.write(r.buf, now, interval, r.bad)
	r.tabMu.Lock()
	old := r.tab
	r.tab = nt
	r.tabMu.Unlock()
	old.setState(stateReplaced)
	old.close()
	return nil
}

func (r *run) acceptLoop() {
	defer r.wg.Done()
	for {
		c, err := r.ln.AcceptUnix()
		if err != nil {
			select {
			case <-r.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of fds or the like: back off and try again.
			select {
			case <-r.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		r.serve(c)
		c.Close()
	}
}

// serve hands the table's fd to a reader with the same uid, or root.
func (r *run) serve(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(time.Second))
	_, uid, _, err := sys.PeerCred(c)
	if err != nil {
		return
	}
	if uid != 0 && uid != r.euid {
		c.Write([]byte(helloDenied))
		return
	}
	r.tabMu.Lock()
	defer r.tabMu.Unlock()
	shm.SendSegments(c, []byte(helloOK), r.tab.seg)
}
