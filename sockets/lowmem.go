package sockets

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/mem"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/nic"
)

// Locked memory is a budget (RLIMIT_MEMLOCK, 8 MiB by default for an
// unprivileged user, or Config.MaxPinnedBytes), and a failure to pin is a
// reason to take a path that pins less, never to fail a call:
//
//   - a zero-copy source that cannot be pinned is copied, in CopyChunk
//     pieces as a chosen copy is, and a Write larger than half the budget
//     is copied without trying (pinnable): pinning its pieces one after
//     the other would evict the temporary memory they are copied through;
//     likewise a Read whose buffer is larger than half the budget is
//     staged (BenchmarkStreamPinBudget; figures in README.md, "Without
//     root");
//   - temporary memory that cannot be registered whole is registered in
//     smaller pieces, down to one page: a copied write's pieces, and a
//     Read's staging buffer (a Read whose own buffer cannot be pinned
//     takes its data through staging);
//   - a write for which not even a page can be registered goes as small
//     messages, written into the ring to the peer, which needs no pinning
//     (eagerAfterNoBufs).
//
// A connection needs the device's doorbell (a page, once per device) plus
// one page that it can stage received data in: newConn checks the page,
// so that Dial and Accept fail with ENOBUFS below that, not every Read
// later.

// pinnable tells whether n bytes may be pinned in place: at most half the
// pinning budget. A larger registration fails, or takes the room of the
// temporary memory and other connections' buffers, which the registration
// cache evicts to make room (and pins again next time): such a source is
// copied, such a Read buffer staged, without trying.
func (d *device) pinnable(n int) bool {
	cache := d.nic.Cache()
	return cache == nil || int64(n) <= cache.Config().MaxPinnedBytes/2
}

// eagerAfterNoBufs is how long large writes go as small messages after
// one could register nothing: trying again costs a pinning attempt (and
// the registration cache's eviction of everything unused) per write.
const eagerAfterNoBufs = 100 * time.Millisecond

// registerPrefix registers buf, or failing that for lack of resources the
// longest prefix of it, halving down to one page, that can be registered.
// It returns the region and its length.
func (d *device) registerPrefix(owner nic.Owner, buf []byte, access nic.Access) (*nic.MemoryRegion, int, error) {
	n := len(buf)
	for {
		mr, err := d.register(owner, buf[:n], access)
		if err == nil {
			return mr, n, nil
		}
		if !errors.Is(err, syscall.ENOBUFS) || n <= sys.PageSize {
			return nil, 0, err
		}
		n = max(n/2&^(sys.PageSize-1), sys.PageSize)
	}
}

// checkStaging makes sure that a page of temporary memory can be pinned:
// where none can, no rendezvous byte could ever be received. (Pinned
// only, not registered: a full registration table is another matter,
// which a write outlives by the eager path.) The page stays pinned in
// the registration cache for the next staging.
func (d *device) checkStaging() error {
	cache := d.nic.Cache()
	if cache == nil {
		return nil // nothing is pinned
	}
	// A page of its own, pinned and let go at once: the probe leaves
	// nothing locked or cached behind it.
	page, err := sys.MapAnon(sys.PageSize)
	if err != nil {
		return fmt.Errorf("sockets: staging probe: %w", err)
	}
	defer sys.Munmap(page)
	h, err := cache.Register(page, 0)
	if err != nil {
		return enobufs(fmt.Sprintf("no page of locked memory left to receive into after the doorbell (%d bytes; see RLIMIT_MEMLOCK)", d.ctlHeld()), err)
	}
	cache.Deregister(h)
	cache.InvalidateIdle(mem.Addr(page), uintptr(len(page)))
	return nil
}

// sendEagerLocked sends b as data messages: a large write's path when
// nothing can be registered. It returns the bytes sent.
func (c *Conn) sendEagerLocked(b []byte) (int, error) {
	base := c.writeN // for a fault (fault.go)
	defer func() { c.writeN = base }()
	n := 0
	for n < len(b) {
		c.writeN = base + n
		m, err := c.sendDataLocked(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// noBufsLocked is sendLargeLocked's way when nothing could be registered
// for b: small messages, which need nothing new, for a while.
func (c *Conn) noBufsLocked(b []byte) (int, error) {
	c.stats.count(cFallbacks, 1)
	c.eagerUntil = time.Now().Add(eagerAfterNoBufs)
	return c.sendEagerLocked(b[:min(len(b), c.cfg.CopyChunk)])
}

// stageLocked registers the staging buffer, taking one if there is none,
// for the next rem bytes of a transfer: as much of it as it can (shorter
// pieces short of locked memory).
func (c *Conn) stageLocked(rem uint32, access nic.Access) ([]byte, *nic.MemoryRegion, error) {
	if c.stage == nil {
		var err error
		if c.stage, err = c.dev.getTemp(int(min(rem, uint32(c.cfg.StagingSize)))); err != nil {
			return nil, nil, err
		}
	}
	mr, n, err := c.dev.registerPrefix(nic.NoOwner, c.stage[:min(rem, uint32(len(c.stage)))], access)
	if err != nil {
		c.releaseStageLocked()
		return nil, nil, err
	}
	return c.stage[:n], mr, nil
}
