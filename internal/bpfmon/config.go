package bpfmon

import (
	"fmt"
	"os"
	"slices"
)

// Method is a way of attaching the probes.
type Method string

// The attach methods.
const (
	TpBtf         Method = "tp_btf"         // tp_btf/sys_enter: BTF-typed raw tracepoint, one program
	RawTracepoint Method = "raw_tracepoint" // raw_tracepoint/sys_enter, one program
	Tracepoint    Method = "tracepoint"     // syscalls/sys_enter_* tracepoints, one per call (tracefs)
	Kprobe        Method = "kprobe"         // kprobes on __x64_sys_*, one per call
)

// Methods returns every attach method in the default order: first those
// that cost the rest of the host least (see the package documentation) —
// kprobes on the six calls, which nothing else pays for, then the
// per-call tracepoints, whose programs run only for the calls we watch —
// and last the generic sys_enter ones, whose program runs at every system
// call of every process on the host.
func Methods() []Method { return []Method{Kprobe, Tracepoint, TpBtf, RawTracepoint} }

// Config configures Open. The zero Config means the defaults.
type Config struct {
	// RingSize is the size of the ring buffer in bytes: a power of two and
	// a multiple of the page size. 0 means 256 KiB (6,553 events of 40
	// bytes).
	RingSize int
	// MaxPids bounds the number of watched processes. 0 means 64.
	MaxPids int
	// MaxGranules bounds the number of watched 2 MiB granules (4 KiB of
	// kernel memory per 64). 0 means 65,536 (128 GiB of address space).
	MaxGranules int
	// Methods are the attach methods to try, in order; empty means
	// Methods().
	Methods []Method
	// WatchAll starts the monitor reporting every range (see WatchAll).
	WatchAll bool
	// ExcludeSelf leaves the opening process out of the watched processes
	// (AddPid adds it later).
	ExcludeSelf bool
}

// DefaultConfig returns the default configuration.
func DefaultConfig() Config {
	return Config{RingSize: 256 << 10, MaxPids: 64, MaxGranules: 1 << 16, Methods: Methods()}
}

// Validate reports a configuration Open would refuse.
func (c *Config) Validate() error {
	page := os.Getpagesize()
	if c.RingSize < 0 || c.RingSize > 0 && (c.RingSize&(c.RingSize-1) != 0 || c.RingSize%page != 0) {
		return fmt.Errorf("bpfmon: ring size %d is not a power-of-two multiple of %d", c.RingSize, page)
	}
	if c.RingSize > 1<<30 {
		return fmt.Errorf("bpfmon: ring size %d above 1 GiB", c.RingSize)
	}
	if c.MaxPids < 0 || c.MaxGranules < 0 {
		return fmt.Errorf("bpfmon: negative limit (pids %d, granules %d)", c.MaxPids, c.MaxGranules)
	}
	for _, m := range c.Methods {
		if !slices.Contains(Methods(), m) {
			return fmt.Errorf("bpfmon: unknown attach method %q", m)
		}
	}
	return nil
}

// withDefaults returns c with zero fields set to the defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.RingSize == 0 {
		c.RingSize = d.RingSize
	}
	if c.MaxPids == 0 {
		c.MaxPids = d.MaxPids
	}
	if c.MaxGranules == 0 {
		c.MaxGranules = d.MaxGranules
	}
	if len(c.Methods) == 0 {
		c.Methods = d.Methods
	}
	return c
}
