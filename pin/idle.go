package pin

import (
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
)

// An eBPF monitor costs tens of milliseconds of CPU to load (BTF, the
// verifier) and a few hundred to detach (RCU grace periods), and it is the
// same for every cache of the process: its probes watch this process's
// address space, filtered to the granules a cache asks for. A cache that
// closes therefore leaves its monitor idle — nothing watched, no events
// pending — for a while (SetIdleMonitorLinger), and the next cache that
// wants one (Auto or EBPF) adopts it at once instead of loading another.
// A program whose connections come and go (its device closes a second
// after the last one) loads the probes once, not once per burst of
// connections.
//
// One monitor is kept: a second cache closing while one is idle closes
// the older. CloseIdleMonitors closes it at once.

// DefaultIdleMonitorLinger is how long an idle eBPF monitor stays loaded
// and attached unless SetIdleMonitorLinger says otherwise. While it is,
// its probes still run at the entry of munmap and its siblings anywhere
// on the host (docs/setup.md measures that tax); for this process they
// find no granule watched and publish nothing.
const DefaultIdleMonitorLinger = 10 * time.Second

var monitorLinger atomic.Int64 // a time.Duration

func init() { monitorLinger.Store(int64(DefaultIdleMonitorLinger)) }

// SetIdleMonitorLinger sets how long the eBPF monitor of a closed cache
// stays loaded for the process's next cache, and returns the previous
// setting. d <= 0 keeps none: a cache's Close detaches its monitor, and
// one idle now is closed at once (CloseIdleMonitors, whose error it
// drops; call that for the error). For the whole process: the idle
// monitor is the process's, not a cache's.
func SetIdleMonitorLinger(d time.Duration) time.Duration {
	old := time.Duration(monitorLinger.Swap(int64(d)))
	if d <= 0 {
		CloseIdleMonitors()
	}
	return old
}

var idle struct {
	mu    lockrank.Mutex // guards the rest; a leaf
	mon   *ebpfMon       // nil: none idle
	rep   MonitorReport  // what its cache reported
	timer *time.Timer    // closes mon when its linger is over
}

func init() { idle.mu.Init(lockrank.PinIdle) }

// testHookIdleExpired, when set, is called after an idle monitor closed
// because nobody adopted it within its linger.
var testHookIdleExpired atomic.Pointer[func()]

// park keeps m idle for the next cache, reporting whether it did; when it
// did not, the caller closes m. Called once m's cache is closed and no
// goroutine of the cache uses m any more.
func park(m monitor, rep MonitorReport) bool {
	e, ok := m.(*ebpfMon)
	linger := time.Duration(monitorLinger.Load())
	if !ok || linger <= 0 {
		return false
	}
	if e.reset() != nil {
		return false
	}
	idle.mu.Lock()
	if linger = time.Duration(monitorLinger.Load()); linger <= 0 {
		idle.mu.Unlock() // set to none meanwhile
		return false
	}
	old := idle.mon
	if idle.timer != nil {
		idle.timer.Stop()
	}
	idle.mon, idle.rep = e, rep
	idle.timer = time.AfterFunc(linger, func() { expire(e) })
	idle.mu.Unlock()
	if old != nil {
		old.close()
	}
	return true
}

// expire closes e if it is still the idle monitor.
func expire(e *ebpfMon) {
	idle.mu.Lock()
	if idle.mon != e {
		idle.mu.Unlock()
		return // adopted, or replaced by a newer one
	}
	idle.mon, idle.timer = nil, nil
	idle.mu.Unlock()
	e.close()
	if h := testHookIdleExpired.Load(); h != nil {
		(*h)()
	}
}

// adoptIdle takes the idle monitor for a cache of cfg, if cfg wants one
// (Auto or EBPF) and one opened as this process opens them now is idle;
// it runs again.
func (cfg Config) adoptIdle() (monitor, MonitorReport, bool) {
	if cfg.Monitor != MonitorAuto && cfg.Monitor != MonitorEBPF {
		return nil, MonitorReport{}, false
	}
	idle.mu.Lock()
	e, rep := idle.mon, idle.rep
	if e == nil || e.ring != ebpfRingSize {
		idle.mu.Unlock()
		return nil, MonitorReport{}, false
	}
	idle.timer.Stop()
	idle.mon, idle.timer = nil, nil
	idle.mu.Unlock()
	e.run()
	return e, rep, true
}

// CloseIdleMonitors detaches and closes the eBPF monitor a closed cache
// left for the next one, if any, without waiting for it to expire: a
// program that is done with the transport for good, or a measurement of
// the host without probes.
func CloseIdleMonitors() error {
	idle.mu.Lock()
	e := idle.mon
	if e != nil {
		idle.timer.Stop()
		idle.mon, idle.timer = nil, nil
	}
	idle.mu.Unlock()
	if e == nil {
		return nil
	}
	return e.close()
}
