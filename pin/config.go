package pin

import (
	"fmt"

	"github.com/sandirect/sandirect/internal/sys"
)

// Access says what a registration allows. The zero value is local read
// access only (the local source of an RDMA Write).
type Access uint32

const (
	// AccessLocalWrite lets the local NIC write the buffer (local target of
	// an RDMA Read, a posted receive).
	AccessLocalWrite Access = 1 << iota
	// AccessRemoteRead exposes the buffer to the peer's RDMA Reads.
	AccessRemoteRead
	// AccessRemoteWrite exposes the buffer to the peer's RDMA Writes.
	AccessRemoteWrite

	accessAll    = AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite
	accessRemote = AccessRemoteRead | AccessRemoteWrite
)

// Remote tells whether a includes remote access.
func (a Access) Remote() bool { return a&accessRemote != 0 }

func (a Access) String() string {
	s := "local-read"
	if a&AccessLocalWrite != 0 {
		s += "|local-write"
	}
	if a&AccessRemoteRead != 0 {
		s += "|remote-read"
	}
	if a&AccessRemoteWrite != 0 {
		s += "|remote-write"
	}
	return s
}

// Owner names who cached a registration, typically a connection, so that
// Flush can release what it cached before it closes. NoOwner is shared.
type Owner uint64

// NoOwner is the owner of registrations made with Register.
const NoOwner Owner = 0

// Config sets the limits and the monitor of a Cache. The zero value of a
// field means its default; a nil *Config means DefaultConfig().
type Config struct {
	// MaxEntries bounds the registrations alive at once: cached, in use,
	// and invalidated but not yet released. Default 4096.
	MaxEntries int
	// MaxPinnedBytes bounds the bytes the cache keeps locked (page
	// granular). Default: RLIMIT_MEMLOCK, or half the physical memory when
	// the process holds CAP_IPC_LOCK or the limit is infinite.
	MaxPinnedBytes int64
	// MaxBacklog bounds the address ranges reported by the monitor and not
	// yet applied; overlapping and adjacent ones are merged, and beyond the
	// bound the whole cache is flushed (Stats.EventsLost, FullFlushes).
	// Rounded up to a power of two. Default 1024.
	MaxBacklog int
	// Monitor selects how foreign memory (not from Alloc) is watched for
	// address-space changes. Default MonitorAuto.
	Monitor MonitorKind
	// Hooks connect the NIC; nil means no NIC (pinning and caching only).
	Hooks Hooks
}

const (
	defaultMaxEntries = 4096
	defaultMaxBacklog = 1024
)

// DefaultConfig returns the defaults, with MaxPinnedBytes computed for this
// process now.
func DefaultConfig() Config {
	return Config{
		MaxEntries:     defaultMaxEntries,
		MaxPinnedBytes: defaultMaxPinned(),
		MaxBacklog:     defaultMaxBacklog,
		Monitor:        MonitorAuto,
	}
}

func defaultMaxPinned() int64 {
	half := int64(sys.MemTotal() / 2)
	if half <= 0 {
		half = 1 << 30
	}
	if sys.HasCapIPCLock() {
		return half
	}
	lim, err := sys.MemlockLimit()
	if err != nil || lim == ^uint64(0) || lim > uint64(half) {
		return half
	}
	return int64(lim)
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	if c.MaxEntries == 0 {
		c.MaxEntries = defaultMaxEntries
	}
	if c.MaxPinnedBytes == 0 {
		c.MaxPinnedBytes = defaultMaxPinned()
	}
	if c.MaxBacklog == 0 {
		c.MaxBacklog = defaultMaxBacklog
	}
	return c
}

// Validate reports a field out of range; zero fields are valid (defaults).
func (c Config) Validate() error {
	switch {
	case c.MaxEntries < 0:
		return fmt.Errorf("%w: MaxEntries %d < 0", ErrInvalidConfig, c.MaxEntries)
	case c.MaxPinnedBytes < 0:
		return fmt.Errorf("%w: MaxPinnedBytes %d < 0", ErrInvalidConfig, c.MaxPinnedBytes)
	case c.MaxPinnedBytes != 0 && c.MaxPinnedBytes < int64(sys.PageSize):
		return fmt.Errorf("%w: MaxPinnedBytes %d below one page", ErrInvalidConfig, c.MaxPinnedBytes)
	case c.MaxBacklog < 0 || c.MaxBacklog > 1<<20:
		return fmt.Errorf("%w: MaxBacklog %d not in [0, 1<<20]", ErrInvalidConfig, c.MaxBacklog)
	case c.Monitor < MonitorAuto || c.Monitor > MonitorNone:
		return fmt.Errorf("%w: unknown Monitor %d", ErrInvalidConfig, c.Monitor)
	}
	return nil
}
