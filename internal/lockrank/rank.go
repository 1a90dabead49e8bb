// Package lockrank gives the library's mutexes their ranks of
// docs/locking.md. A goroutine that holds a ranked lock may only take locks
// of a higher rank. Built with -tags lockrank, every Lock checks that and a
// violation is recorded and panics; without the tag a Mutex is a sync.Mutex
// and its methods forward to it.
package lockrank

import "fmt"

// Rank is a lock's place in the order: a goroutine takes locks in
// increasing rank. The zero Rank is unranked: such a lock is not checked.
type Rank int

// The ranks of docs/locking.md, which is their documentation: a change
// here changes the table there in the same commit.
const (
	Unranked Rank = 0

	ConnLend        Rank = 5  // sockets.Conn.lendMu
	ConnRecv        Rank = 20 // sockets.Conn.mu.recv
	ConnSend        Rank = 21 // sockets.Conn.mu.send
	ListenerPending Rank = 25 // sockets.Listener.pmu
	NegativeCache   Rank = 26 // sockets.negativeCache.mu
	Devices         Rank = 27 // sockets devices.mu
	Published       Rank = 28 // sockets published.mu
	StatsRun        Rank = 29 // stats.publisher.runMu
	Stats           Rank = 30 // stats.publisher.mu
	StatsTable      Rank = 31 // stats.run.tabMu
	AllStats        Rank = 32 // sockets allStats.mu
	Device          Rank = 33 // sockets.device.mu
	CtlPools        Rank = 34 // sockets.ctlPools.mu
	PieceCopier     Rank = 35 // sockets.pieceCopier.mu
	Buffers         Rank = 36 // sockets buffers.mu
	PinCache        Rank = 40 // pin.Cache.mu
	PinCaches       Rank = 41 // pin caches.mu
	PinOwned        Rank = 41 // pin owned.mu, never held with caches.mu
	MonitorLife     Rank = 45 // internal/bpfmon.Monitor.lifeMu
	MonitorDrain    Rank = 46 // internal/bpfmon.Monitor.drainMu
	MonitorCtl      Rank = 46 // internal/bpfmon.Monitor.ctlMu, never held with drainMu
	NICDevice       Rank = 50 // nic.Device.mu
	NICPending      Rank = 51 // nic.Pending.mu
	CQWait          Rank = 55 // nic.CompletionQueue.waitMu
	QPSend          Rank = 60 // nic.QueuePair.sqMu
	QPRecv          Rank = 61 // nic.QueuePair.rqMu
	QPConn          Rank = 62 // nic.QueuePair.connMu
	PeerSegments    Rank = 63 // nic.peerInfo.segMu
	QPRetire        Rank = 64 // nic.QueuePair.retireMu
	CQ              Rank = 70 // nic.CompletionQueue.mu
	Engine          Rank = 71 // nic.engine.mu
	Hub             Rank = 80 // shm.Hub.mu

	// The leaves: taken last, never two together, calling nothing that
	// locks.
	Lingering   Rank = 90 // sockets lingering.mu
	Deadline    Rank = 91 // sockets.deadline.mu
	NICImports  Rank = 92 // nic imports.mu
	StatsReader Rank = 93 // stats.Reader.mu
	PinIdle     Rank = 94 // pin idle.mu
)

var names = map[Rank]string{
	ConnLend:        "sockets.Conn.lendMu",
	ConnRecv:        "sockets.Conn.mu.recv",
	ConnSend:        "sockets.Conn.mu.send",
	ListenerPending: "sockets.Listener.pmu",
	NegativeCache:   "sockets.negativeCache.mu",
	Devices:         "sockets.devices.mu",
	Published:       "sockets.published.mu",
	StatsRun:        "stats.publisher.runMu",
	Stats:           "stats.publisher.mu",
	StatsTable:      "stats.run.tabMu",
	AllStats:        "sockets.allStats.mu",
	Device:          "sockets.device.mu",
	CtlPools:        "sockets.ctlPools.mu",
	PieceCopier:     "sockets.pieceCopier.mu",
	Buffers:         "sockets.buffers.mu",
	PinCache:        "pin.Cache.mu",
	PinCaches:       "pin.caches.mu or pin.owned.mu",
	MonitorLife:     "bpfmon.Monitor.lifeMu",
	MonitorDrain:    "bpfmon.Monitor.drainMu or ctlMu",
	NICDevice:       "nic.Device.mu",
	NICPending:      "nic.Pending.mu",
	CQWait:          "nic.CompletionQueue.waitMu",
	QPSend:          "nic.QueuePair.sqMu",
	QPRecv:          "nic.QueuePair.rqMu",
	QPConn:          "nic.QueuePair.connMu",
	PeerSegments:    "nic.peerInfo.segMu",
	QPRetire:        "nic.QueuePair.retireMu",
	CQ:              "nic.CompletionQueue.mu",
	Engine:          "nic.engine.mu",
	Hub:             "shm.Hub.mu",
	Lingering:       "sockets.lingering.mu",
	Deadline:        "sockets.deadline.mu",
	NICImports:      "nic.imports.mu",
	StatsReader:     "stats.Reader.mu",
	PinIdle:         "pin.idle.mu",
}

// String names the lock of the rank, as docs/locking.md does.
func (r Rank) String() string {
	if n, ok := names[r]; ok {
		return fmt.Sprintf("%s (rank %d)", n, int(r))
	}
	return fmt.Sprintf("rank %d", int(r))
}

// Violation is a lock taken out of order: Taken, while the goroutine held
// Held, whose rank is not lower.
type Violation struct {
	Held, Taken Rank
	Stack       string // the goroutine's stack at the Lock
}

func (v Violation) String() string {
	return fmt.Sprintf("lock order: %v taken while holding %v\n%s", v.Taken, v.Held, v.Stack)
}
