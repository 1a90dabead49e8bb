package sockets

import (
	"fmt"
	"time"

	"github.com/sandirect/sandirect/shm"
)

// ZeroCopy says how the sending side of a rendezvous sources its data.
type ZeroCopy uint8

const (
	// ZeroCopyAuto lets the switch choose per write, from how the
	// application behaves (see Config.CopyThreshold).
	ZeroCopyAuto ZeroCopy = iota
	// ZeroCopyAlways registers the application's buffer in place: no copy,
	// but the write waits until the peer has taken the data.
	ZeroCopyAlways
	// ZeroCopyNever copies into registered temporary memory, so that a write
	// returns as soon as its data is copied.
	ZeroCopyNever
)

func (z ZeroCopy) String() string {
	switch z {
	case ZeroCopyAuto:
		return "auto"
	case ZeroCopyAlways:
		return "always"
	case ZeroCopyNever:
		return "never"
	}
	return fmt.Sprintf("ZeroCopy(%d)", uint8(z))
}

// Config configures connections and listeners. A nil *Config means
// DefaultConfig(); a zero field means that field's default.
type Config struct {
	// BufferSize is the largest message this side receives, header
	// included, and the unit of credit: a data message may carry up to
	// twice its payload and counts two credits then (protocol version 6),
	// so that an eager write goes in fragments of 16 KiB while small
	// messages each take one credit. Default 8232, 8 KiB of data and the
	// 40-byte header (docs/protocol.md, "Eager": chosen by measurement).
	BufferSize int
	// Window is how many credits the peer may use unacknowledged: a
	// message takes one, a data message of more than one BufferSize's
	// payload two. The last two are kept for control and credit messages.
	// The ring from the peer holds Window+2 messages of BufferSize (the
	// two for the padding of a wrap), rounded up to a power of two (512
	// KiB by default); it is mapped lazily, so an idle connection does
	// not pay for it, a busy one does: its two rings, up to 1 MiB of
	// shared memory by default, stay in memory until it closes. Default
	// 60, chosen by measurement (docs/protocol.md, "Eager"): a program
	// with many busy connections and little to stream may halve the rings
	// with 24.
	Window int
	// SendBuffers is the send part of the control-message pool. Default 4.
	SendBuffers int
	// EagerThreshold: writes of at most this many bytes travel as data
	// messages in the ring, pipelined (the reader copies one out while
	// the writer copies the next in), when the credits held carry all of
	// the write; larger ones, and ones the credits do not carry, use a
	// rendezvous (eager.go). Default 128 KiB.
	EagerThreshold int
	// MaxTransfer bounds the bytes one rendezvous moves; larger writes use
	// several. Default 16 MiB.
	MaxTransfer int
	// ZeroCopy chooses between registering a large source in place and
	// copying it into temporary memory. Default ZeroCopyAuto.
	ZeroCopy ZeroCopy
	// CopyThreshold: in ZeroCopyAuto, a rendezvous of fewer bytes is
	// copied (the write returns at once). Default 256 KiB.
	CopyThreshold int
	// ZeroCopyMax: in ZeroCopyAuto, a read rendezvous from CopyThreshold
	// to ZeroCopyMax bytes from a buffer the application reuses is
	// zero-copy (unless a write deadline is set); a larger one is copied
	// in CopyChunk pieces, which pipeline: the writer copies a piece while
	// the reader takes the one before (docs/performance.md, "Copy or zero
	// copy"). When ZeroCopyMax is 0 (the default), a stream's writes are
	// copied so, and a write the reader waits for (a request, an answer)
	// goes the way the connection measured faster for such writes:
	// copied, or read by the peer in place (docs/performance.md, "Copy or
	// zero copy, learned").
	ZeroCopyMax int
	// SplitMin: a zero-copy read rendezvous of at least this many bytes,
	// from a buffer the application reuses, is offered to the peer as a
	// split transfer (protocol version 3): the peer RDMA-Reads the first
	// half into its Read buffer while we RDMA-Write the second half into
	// it, each side one copy of half the bytes, both cores at once. Only
	// when both buffers are in huge pages, which we ask the kernel for
	// (sys.CollapseHuge): a cross-process copy pins the other side's
	// pages one by one, and with 4 KiB pages that is slower than copying
	// twice through shared memory. On the receiving side it is the
	// smallest transfer this side splits. Default 2 MiB; negative: never
	// (neither offered nor accepted). See docs/protocol.md, "Split
	// transfers".
	SplitMin int
	// CopyChunk is the largest rendezvous of copied data (one temporary
	// buffer). Default 960 KiB: below the 1 MiB from which Go's copy
	// bypasses the caches, so the reader finds each piece in cache.
	CopyChunk int
	// WaitedChunk bounds the pieces of a copied write that found none of
	// this connection's copies in flight — one a reader waits for, a
	// request or its answer — so that the reader copies one out while the
	// writer copies the next in, instead of waiting for a whole CopyChunk
	// (docs/performance.md, "Pieces of a write the reader waits for"). A
	// stream keeps copies in flight,
	// and its CopyChunk pieces. Default 256 KiB; negative: CopyChunk for
	// every write.
	WaitedChunk int
	// MaxCopyInFlight bounds the copied bytes of one connection that the
	// peer has not taken yet. Default 4 MiB.
	MaxCopyInFlight int
	// TempMemory bounds the temporary (device) memory of one device: copies
	// and receive staging. Default 64 MiB.
	TempMemory int
	// StagingSize is the receive staging buffer used when a Read is too
	// small to take a rendezvous directly. Default 256 KiB.
	StagingSize int
	// DirectRead: a Read of at least this many bytes (or of the whole rest
	// of a transfer) receives rendezvous data into its own buffer.
	// Default 64 KiB.
	DirectRead int
	// NoRDMARead disables RDMA Read on this side: the peer then uses the
	// write rendezvous towards us.
	NoRDMARead bool
	// MaxRegions bounds the registration table of the device (nic).
	// Default 4096.
	MaxRegions int
	// MaxPinnedBytes bounds the memory the device's registration cache
	// keeps locked: zero-copy sources, direct-read sinks, the doorbell and
	// temporary memory. Past it a write or Read takes a path that pins
	// less (see "Locked memory" in the package doc). Default (0): pin's
	// default, from RLIMIT_MEMLOCK and the machine's memory.
	MaxPinnedBytes int64
	// Wait says how a blocked call waits for the peer: busy polling,
	// parking (the goroutine sleeps in the Go scheduler until the peer
	// wakes it), or spinning while spinning pays, then parking (default).
	Wait shm.WaitConfig
	// ReplyWait: in block mode, a call that is about to sleep right after
	// this side sent a message first looks for the answer this long. An
	// answer inside it costs no sleep and no wake-up; the look costs what a
	// protocol that wakes its peer on every message spends in that system
	// call when the peer is awake, and nothing at all while no message
	// goes out (docs/performance.md). Default 1 µs; negative: sleep at once.
	ReplyWait time.Duration
	// ForceTCP makes "tcp" dials use plain TCP even to this host.
	ForceTCP bool
	// Linger bounds how long a closed connection keeps delivering what it
	// wrote before it resets. Default 30 s.
	Linger time.Duration
	// HandshakeTimeout bounds connection set-up. Default 10 s.
	HandshakeTimeout time.Duration

	versions [2]uint16 // protocol versions offered; zero: all we speak (tests)
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		BufferSize:       8<<10 + headerSize,
		Window:           60,
		SendBuffers:      4,
		EagerThreshold:   128 << 10,
		MaxTransfer:      16 << 20,
		CopyThreshold:    256 << 10,
		ZeroCopyMax:      0,
		SplitMin:         2 << 20,
		CopyChunk:        960 << 10,
		WaitedChunk:      256 << 10,
		MaxCopyInFlight:  4 << 20,
		TempMemory:       64 << 20,
		StagingSize:      256 << 10,
		DirectRead:       64 << 10,
		MaxRegions:       4096,
		Wait:             shm.DefaultWaitConfig(),
		ReplyWait:        time.Microsecond,
		Linger:           30 * time.Second,
		HandshakeTimeout: 10 * time.Second,
	}
}

// Limits of the configuration.
const (
	minBufferSize = 256
	maxBufferSize = 64 << 10
	minWindow     = 4
	maxWindow     = 1024
	maxTransfer   = 1 << 30
	minSplit      = 8 << 10 // two pages: a head and a tail
)

// withDefaults fills zero fields with their defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	set := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.BufferSize, d.BufferSize)
	set(&c.Window, d.Window)
	set(&c.SendBuffers, d.SendBuffers)
	set(&c.EagerThreshold, d.EagerThreshold)
	set(&c.MaxTransfer, d.MaxTransfer)
	set(&c.CopyThreshold, d.CopyThreshold)
	set(&c.ZeroCopyMax, d.ZeroCopyMax)
	set(&c.SplitMin, d.SplitMin)
	set(&c.CopyChunk, d.CopyChunk)
	set(&c.WaitedChunk, d.WaitedChunk)
	set(&c.MaxCopyInFlight, d.MaxCopyInFlight)
	set(&c.TempMemory, d.TempMemory)
	set(&c.StagingSize, d.StagingSize)
	set(&c.DirectRead, d.DirectRead)
	set(&c.MaxRegions, d.MaxRegions)
	if c.Wait == (shm.WaitConfig{}) {
		c.Wait = d.Wait
	}
	if c.Wait.Mode == shm.WaitAdaptive && c.Wait.Spin == 0 {
		c.Wait.Spin = shm.DefaultSpin
	}
	if c.Linger == 0 {
		c.Linger = d.Linger
	}
	if c.ReplyWait == 0 {
		c.ReplyWait = d.ReplyWait
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	return c
}

// Validate reports a configuration that cannot work. Zero fields are
// taken as their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.BufferSize < minBufferSize || c.BufferSize > maxBufferSize:
		return fmt.Errorf("%w: BufferSize %d outside [%d, %d]", ErrConfig, c.BufferSize, minBufferSize, maxBufferSize)
	case c.Window < minWindow || c.Window > maxWindow:
		return fmt.Errorf("%w: Window %d outside [%d, %d]", ErrConfig, c.Window, minWindow, maxWindow)
	case c.SendBuffers < 1 || c.SendBuffers > maxWindow:
		return fmt.Errorf("%w: SendBuffers %d outside [1, %d]", ErrConfig, c.SendBuffers, maxWindow)
	case c.EagerThreshold < 0:
		return fmt.Errorf("%w: negative EagerThreshold", ErrConfig)
	case c.MaxTransfer < 4096 || c.MaxTransfer > maxTransfer:
		return fmt.Errorf("%w: MaxTransfer %d outside [4096, %d]", ErrConfig, c.MaxTransfer, maxTransfer)
	case c.CopyChunk < 4096 || c.CopyChunk > c.MaxTransfer:
		return fmt.Errorf("%w: CopyChunk %d outside [4096, MaxTransfer]", ErrConfig, c.CopyChunk)
	case c.WaitedChunk > 0 && (c.WaitedChunk < 4096 || c.WaitedChunk > c.MaxTransfer):
		return fmt.Errorf("%w: WaitedChunk %d outside [4096, MaxTransfer]", ErrConfig, c.WaitedChunk)
	case c.CopyThreshold < 0 || c.MaxCopyInFlight < 0 || c.TempMemory < 0:
		return fmt.Errorf("%w: negative copy limit", ErrConfig)
	case c.ZeroCopyMax != 0 && c.ZeroCopyMax < c.CopyThreshold:
		return fmt.Errorf("%w: ZeroCopyMax %d below CopyThreshold %d", ErrConfig, c.ZeroCopyMax, c.CopyThreshold)
	case c.SplitMin > 0 && c.SplitMin < minSplit:
		return fmt.Errorf("%w: SplitMin %d below %d", ErrConfig, c.SplitMin, minSplit)
	case c.StagingSize < 4096 || c.StagingSize > maxTransfer:
		return fmt.Errorf("%w: StagingSize %d outside [4096, %d]", ErrConfig, c.StagingSize, maxTransfer)
	case c.DirectRead < 1:
		return fmt.Errorf("%w: DirectRead must be positive", ErrConfig)
	case c.MaxPinnedBytes < 0:
		return fmt.Errorf("%w: negative MaxPinnedBytes", ErrConfig)
	case c.MaxRegions < 1:
		return fmt.Errorf("%w: MaxRegions must be positive", ErrConfig)
	case c.ZeroCopy > ZeroCopyNever:
		return fmt.Errorf("%w: unknown ZeroCopy %d", ErrConfig, c.ZeroCopy)
	case c.Linger < 0 || c.HandshakeTimeout < 0:
		return fmt.Errorf("%w: negative duration", ErrConfig)
	}
	if err := c.Wait.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// resolve returns the configuration in force for cfg (nil: defaults).
func resolve(cfg *Config) (Config, error) {
	c := DefaultConfig()
	if cfg != nil {
		c = cfg.withDefaults()
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// recordSize is what one message of n bytes occupies in a nic ring
// (an 8-byte record header, 8-byte aligned).
func recordSize(n int) int { return (8 + n + 7) &^ 7 }

// ringCapacity is the nic ring size that holds window messages of
// bufSize bytes plus the padding of a wrap: less than the largest record,
// a data message of two credits (unitsOf).
func ringCapacity(window, bufSize int) int {
	need := (window + 2) * recordSize(bufSize)
	c := shm.MinRingCapacity
	for c < need {
		c <<= 1
	}
	return c
}
