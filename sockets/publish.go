package sockets

import (
	"sync/atomic"

	"github.com/sandirect/sandirect/internal/lockrank"
	pubstats "github.com/sandirect/sandirect/stats"
)

// Statistics published for tools/sdstat (package stats): while the
// process has a shared-memory device open (a connection or a listener of
// ours), one source publishes the group
//
//	sockets   GlobalStats (every connection, closed ones included), as
//	          snake_case names (bytes_eager, copy_chosen, enobufs, …), and
//	          connections (open now) and devices (nic devices open now;
//	          each is also published as device/N by package nic)
//
// The source is registered when the first device opens and removed when
// the last one closes, so that a process that no longer uses the package
// holds no publisher.
var published struct {
	// mu guards unregister and the changes of devs. Lock order:
	// devices.mu, mu, the stats publisher's locks, allStats.mu (the
	// snapshot's only lock).
	mu         lockrank.Mutex
	devs       atomic.Int64 // open devices; read by the snapshot without mu
	unregister func()
}

func init() { published.mu.Init(lockrank.Published) }

// publishHold counts one more open device (from acquireDevice).
func publishHold() {
	published.mu.Lock()
	defer published.mu.Unlock()
	if published.devs.Add(1) == 1 {
		published.unregister = pubstats.RegisterGroups(snapshotStats)
	}
}

// publishRelease counts one device fewer (from device.release); the last
// one removes the source, waiting for a running snapshot (which takes
// allStats.mu only).
func publishRelease() {
	published.mu.Lock()
	defer published.mu.Unlock()
	if published.devs.Add(-1) == 0 && published.unregister != nil {
		published.unregister()
		published.unregister = nil
	}
}

const statsGroup = "sockets"

// snapshotStats is the source's snapshot, run by the stats publisher.
func snapshotStats(emit func(group, name string, v uint64)) {
	c := GlobalStats()
	allStats.mu.Lock()
	conns := len(allStats.live)
	allStats.mu.Unlock()
	devs := published.devs.Load()
	e := func(name string, v uint64) { emit(statsGroup, name, v) }
	e("connections", uint64(conns))
	e("devices", uint64(max(devs, 0)))
	e("bytes_eager", c.BytesEager)
	e("bytes_inline", c.BytesInline)
	e("bytes_read_rendezvous", c.BytesReadRendezvous)
	e("bytes_write_rendezvous", c.BytesWriteRendezvous)
	e("bytes_zero_copy", c.BytesZeroCopy)
	e("bytes_copied", c.BytesCopied)
	e("bytes_copied_nt", c.BytesCopiedNT)
	e("bytes_direct", c.BytesDirect)
	e("bytes_direct_nt", c.BytesDirectNT)
	e("bytes_staged", c.BytesStaged)
	e("bytes_read", c.BytesRead)
	e("bytes_split_tail", c.BytesSplitTail)
	e("rendezvous", c.Rendezvous)
	e("copy_chosen", c.CopyChosen)
	e("zero_chosen", c.ZeroChosen)
	e("copy_new_buffer", c.CopyNewBuffer)
	e("copy_peer_stages", c.CopyPeerStages)
	e("zero_shared", c.ZeroShared)
	e("zero_split", c.ZeroSplit)
	e("splits", c.Splits)
	e("fallbacks", c.Fallbacks)
	e("rdma_reads", c.RDMAReads)
	e("rdma_writes", c.RDMAWrites)
	e("msgs_sent", c.MsgsSent)
	e("msgs_received", c.MsgsReceived)
	e("credit_msgs", c.CreditMsgs)
	e("credit_stalls", c.CreditStalls)
	e("cancels", c.Cancels)
	e("enobufs", c.ENOBUFS)
	e("aborts", c.Aborts)
	e("resets", c.Resets)
	e("doorbells", c.Doorbells)
	e("registers", c.Registers)
	e("sleeps", c.Sleeps)
	e("replies_caught", c.RepliesCaught)
	e("spills", c.Spills)
	e("waits_spun", c.WaitsSpun)
	e("waits_parked", c.WaitsParked)
	e("inline_takes", c.InlineTakes)
	e("poller_waits", c.PollerWaits)
	e("quick_closes", c.QuickCloses)
}
