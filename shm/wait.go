package shm

import (
	"fmt"
	"time"
)

// WaitMode says how a ring side waits for its peer.
type WaitMode uint8

const (
	// WaitAdaptive spins for WaitConfig.Spin, then sleeps on the futex.
	WaitAdaptive WaitMode = iota
	// WaitBusyPoll spins until the condition holds or the deadline passes;
	// it never sleeps and never needs a wake-up.
	WaitBusyPoll
	// WaitBlock sleeps on the futex at once.
	WaitBlock
)

func (m WaitMode) String() string {
	switch m {
	case WaitAdaptive:
		return "adaptive"
	case WaitBusyPoll:
		return "busy"
	case WaitBlock:
		return "block"
	}
	return fmt.Sprintf("WaitMode(%d)", uint8(m))
}

// ParseWaitMode parses "adaptive", "busy" or "block".
func ParseWaitMode(s string) (WaitMode, error) {
	for _, m := range []WaitMode{WaitAdaptive, WaitBusyPoll, WaitBlock} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("shm: unknown wait mode %q (want adaptive, busy or block)", s)
}

// WaitConfig configures how a ring side waits. The zero value means
// DefaultWaitConfig.
type WaitConfig struct {
	Mode WaitMode
	// Spin is how long WaitAdaptive spins before it sleeps. A futex
	// wake-up costs many cache-line hand-offs, so spinning for a few tens
	// of microseconds catches most request/response traffic without a
	// system call (docs/performance.md, "shm: waiting").
	Spin time.Duration
}

// DefaultSpin is the default spin phase of WaitAdaptive.
const DefaultSpin = 50 * time.Microsecond

// DefaultWaitConfig returns adaptive waiting with DefaultSpin.
func DefaultWaitConfig() WaitConfig { return WaitConfig{Mode: WaitAdaptive, Spin: DefaultSpin} }

// Validate reports a configuration that cannot work.
func (c WaitConfig) Validate() error {
	if c.Mode > WaitBlock {
		return fmt.Errorf("shm: invalid wait mode %d", c.Mode)
	}
	if c.Spin < 0 {
		return fmt.Errorf("shm: negative spin time %v", c.Spin)
	}
	return nil
}

func (c WaitConfig) orDefault() WaitConfig {
	if c == (WaitConfig{}) {
		return DefaultWaitConfig()
	}
	if c.Mode == WaitAdaptive && c.Spin == 0 {
		c.Spin = DefaultSpin
	}
	return c
}

// WaitStats counts how a side's waits ended. Ready+Spun+Slept is the number
// of waits; Wakes counts FUTEX_WAKE calls this side issued to its peer.
type WaitStats struct {
	Ready uint64 // the condition held at the first look
	Spun  uint64 // it came true while spinning
	Slept uint64 // the side slept on the futex at least once
	Wakes uint64 // wake-ups issued to the peer
}

// spinCheckEvery is how many spin iterations pass between looks at the
// clock, the deadline and the failure state.
const spinCheckEvery = 64
