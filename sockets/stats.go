package sockets

import (
	"sync/atomic"

	"github.com/sandirect/sandirect/internal/lockrank"
)

// Counters is a snapshot of what connections did and which path every
// byte took.
//
// Every byte written is counted once under BytesEager, BytesInline (the
// first part of a rendezvous, inside its rts), BytesReadRendezvous or
// BytesWriteRendezvous; rendezvous bytes are counted again under
// BytesZeroCopy or BytesCopied by how the source was provided, and on the
// receiving side under BytesDirect or BytesStaged by where they landed.
type Counters struct {
	BytesEager           uint64
	BytesInline          uint64
	BytesReadRendezvous  uint64
	BytesWriteRendezvous uint64
	BytesZeroCopy        uint64
	BytesCopied          uint64
	BytesCopiedNT        uint64 // of BytesCopied: copied around the caches (pieceCopier)
	BytesDirect          uint64 // rendezvous bytes received into the Read's own buffer
	BytesDirectNT        uint64 // of BytesDirect: written around the caches (Reads of at least 2 MiB)
	BytesStaged          uint64 // rendezvous bytes received through a staging buffer
	BytesRead            uint64 // bytes returned by Read
	BytesSplitTail       uint64 // of BytesReadRendezvous: the tails of split transfers, which we RDMA-wrote into the peer's Read buffer

	Rendezvous     uint64 // rendezvous started (rts sent)
	CopyChosen     uint64 // rendezvous whose source was copied into temporary memory
	ZeroChosen     uint64 // rendezvous whose source was registered in place
	CopyNewBuffer  uint64 // of CopyChosen: the source was new to the registration cache and not the previous write's buffer
	CopyPeerStages uint64 // of CopyChosen: the peer reads through its staging buffer (its reads are small)
	ZeroShared     uint64 // of ZeroChosen: the source was a buffer from AllocBuffer, which the peer maps
	ZeroSplit      uint64 // of ZeroChosen: offered to the peer as a split transfer (the source is in huge pages)
	Splits         uint64 // transfers received split: we read the head, the peer wrote the tail
	Fallbacks      uint64 // the chosen source failed for lack of resources; the other was used
	RDMAReads      uint64
	RDMAWrites     uint64
	MsgsSent       uint64
	MsgsReceived   uint64
	CreditMsgs     uint64 // explicit credit messages sent
	CreditStalls   uint64 // times a send waited for credit
	Cancels        uint64 // write rendezvous cancelled by a deadline
	ENOBUFS        uint64 // writes that failed with ENOBUFS
	Aborts         uint64 // connections this side aborted
	Resets         uint64 // connections the peer reset or lost
	Doorbells      uint64 // self wake-ups of a sleeping poller
	Registers      uint64 // nic registrations made
	Sleeps         uint64 // times a poller waited on the completion queue (WaitsSpun and WaitsParked of them did not find it at once)
	WaitsSpun      uint64 // of Sleeps: waits that ended while spinning
	WaitsParked    uint64 // of Sleeps: waits that parked (the goroutine slept until woken)
	RepliesCaught  uint64 // block mode: waits whose answer came within Config.ReplyWait
	Spills         uint64 // unread messages moved out of the ring to let a control message behind them go back
	InlineTakes    uint64 // Reads that took messages from the ring under their own lock, without a poller's wait (docs/performance.md)
	PollerWaits    uint64 // a Read, Write or Close that waited for another call's poller round: the two directions meeting on one connection
	QuickCloses    uint64 // Closes that found all they wrote in the peer's ring and hung up at once, without a linger (Conn.Close)
}

type counter int

const (
	cBytesEager counter = iota
	cBytesInline
	cBytesReadRdv
	cBytesWriteRdv
	cBytesZeroCopy
	cBytesCopied
	cBytesCopiedNT
	cBytesDirect
	cBytesDirectNT
	cBytesStaged
	cBytesRead
	cBytesSplitTail
	cRendezvous
	cCopyChosen
	cZeroChosen
	cCopyNewBuffer
	cCopyPeerStages
	cZeroShared
	cZeroSplit
	cSplits
	cFallbacks
	cRDMAReads
	cRDMAWrites
	cMsgsSent
	cMsgsReceived
	cCreditMsgs
	cCreditStalls
	cCancels
	cENOBUFS
	cAborts
	cResets
	cDoorbells
	cRegisters
	cSleeps
	cWaitsSpun
	cWaitsParked
	cRepliesCaught
	cSpills
	cInlineTakes
	cPollerWaits
	cQuickCloses
	nCounters
)

// stats is a connection's set of counters, updated by the connection
// alone (no cache line shared with other connections) and read anywhere.
// Each counter has one writer at a time — the connection's calls, which
// Conn.mu, its gates or the poller's role serialize — so count adds
// without a locked instruction (stats_fast.go) and readers load the word
// atomically, finding it as it was before or after an add: five locked
// adds took 13 % of a small message's software path
// (docs/performance.md, "Counters without locked adds").
type stats struct{ v [nCounters]uint64 }

// load reads counter c as its writer last left it.
func (s *stats) load(c counter) uint64 { return atomic.LoadUint64(&s.v[c]) }

// allStats keeps what GlobalStats adds up: the counters of the live
// connections and the totals of those gone.
var allStats struct {
	mu      lockrank.Mutex // guards live, retired; taken last, under the stats publisher's lock by a snapshot
	live    map[*stats]struct{}
	retired [nCounters]uint64
}

func init() { allStats.mu.Init(lockrank.AllStats) }

// GlobalStats returns the process-wide counters of all connections.
func GlobalStats() Counters {
	var sum stats
	allStats.mu.Lock()
	sum.v = allStats.retired
	for s := range allStats.live {
		for i := range s.v {
			sum.v[i] += s.load(counter(i))
		}
	}
	allStats.mu.Unlock()
	return sum.snapshot()
}

// register makes s count in GlobalStats.
func (s *stats) register() {
	allStats.mu.Lock()
	if allStats.live == nil {
		allStats.live = map[*stats]struct{}{}
	}
	allStats.live[s] = struct{}{}
	allStats.mu.Unlock()
}

// retire folds s into the totals of connections gone.
func (s *stats) retire() {
	allStats.mu.Lock()
	if _, ok := allStats.live[s]; ok {
		delete(allStats.live, s)
		for i := range s.v {
			allStats.retired[i] += s.load(counter(i))
		}
	}
	allStats.mu.Unlock()
}

func (s *stats) snapshot() Counters {
	v := s.load
	return Counters{
		BytesEager: v(cBytesEager), BytesInline: v(cBytesInline),
		BytesReadRendezvous: v(cBytesReadRdv), BytesWriteRendezvous: v(cBytesWriteRdv),
		BytesZeroCopy: v(cBytesZeroCopy), BytesCopied: v(cBytesCopied), BytesCopiedNT: v(cBytesCopiedNT),
		BytesDirect: v(cBytesDirect), BytesDirectNT: v(cBytesDirectNT), BytesStaged: v(cBytesStaged), BytesRead: v(cBytesRead),
		BytesSplitTail: v(cBytesSplitTail),
		Rendezvous:     v(cRendezvous), CopyChosen: v(cCopyChosen), ZeroChosen: v(cZeroChosen),
		CopyNewBuffer: v(cCopyNewBuffer), CopyPeerStages: v(cCopyPeerStages), ZeroShared: v(cZeroShared),
		ZeroSplit: v(cZeroSplit), Splits: v(cSplits),
		Fallbacks: v(cFallbacks), RDMAReads: v(cRDMAReads), RDMAWrites: v(cRDMAWrites),
		MsgsSent: v(cMsgsSent), MsgsReceived: v(cMsgsReceived), CreditMsgs: v(cCreditMsgs),
		CreditStalls: v(cCreditStalls), Cancels: v(cCancels), ENOBUFS: v(cENOBUFS),
		Aborts: v(cAborts), Resets: v(cResets), Doorbells: v(cDoorbells), Registers: v(cRegisters),
		Sleeps: v(cSleeps), WaitsSpun: v(cWaitsSpun), WaitsParked: v(cWaitsParked), RepliesCaught: v(cRepliesCaught), Spills: v(cSpills),
		InlineTakes: v(cInlineTakes), PollerWaits: v(cPollerWaits), QuickCloses: v(cQuickCloses),
	}
}
