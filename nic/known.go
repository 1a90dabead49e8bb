package nic

import (
	"bytes"
	"fmt"
	"net"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// Early dials (QPOptions.Early). A listener answers the same hello the
// same way: its registration table, its hub, its attributes, the private
// data its Answer computes from ours. A device remembers that answer per
// address and hello, with references to the table and hub mappings, for
// importLinger after the last use; a later dial to the same listening
// process (SO_PEERCRED's pid and uid, which the kernel vouches for) then
// builds its queue pair from it and returns once its hello is sent, as a
// Unix socket's connect returns before its listener accepts. The
// connection reader takes the real reply first (takeReply) and fails the
// queue pair unless it is that answer, from the same files.

// knownKey names an answer: the listener's address and our hello's
// private data.
type knownKey struct{ addr, hello string }

// knownPeer is a listener's answer to one hello. Guarded by imports.mu.
type knownPeer struct {
	pid     int
	uid     uint32
	tseg    *shm.Segment  // the listener's registration table: one reference
	note    *shm.Notifier // the listener's hub: one reference
	files   heldFiles     // tseg's and note's files, which the kernel vouched for when they came
	table   peerTable
	attr    Attr
	version uint16
	reply   []byte    // the listener's private data
	until   time.Time // forgotten then, unless used again
}

// maxKnown bounds the answers a device remembers.
const maxKnown = 256

// learn remembers the answer qp, a dial that just completed its
// handshake, got to the hello of key.
func (d *Device) learn(key knownKey, qp *QueuePair) {
	imports.mu.Lock()
	im, in := imports.bySeg[qp.peer.tableSeg], notifiers.byN[qp.note]
	if im == nil || in == nil || d.parked.closed {
		imports.mu.Unlock()
		return
	}
	im.refs++
	in.refs++
	old := d.known[key]
	if old == nil && len(d.known) >= maxKnown {
		for k, kp := range d.known { // full: forget any one
			old = kp
			delete(d.known, k)
			break
		}
	}
	if d.known == nil {
		d.known = map[knownKey]*knownPeer{}
	}
	kp := &knownPeer{pid: qp.peer.pid, uid: qp.peer.uid, tseg: qp.peer.tableSeg, note: qp.note, files: heldFiles{table: im.key.id, hub: in.id},
		table: qp.peer.table, attr: qp.peer.attr, version: qp.peer.version, reply: qp.peer.private, until: time.Now().Add(importLinger)}
	d.known[key] = kp
	d.armSweepLocked(kp.until)
	imports.mu.Unlock()
	if old != nil {
		old.release()
	}
}

// release drops kp's references to the listener's table and hub.
func (kp *knownPeer) release() {
	releaseImport(kp.tseg)
	releaseNotifier(kp.note)
}

// knownFor returns the answer remembered for key if the listener is the
// process that gave it, with a reference to its table and hub taken for
// a new queue pair.
func (d *Device) knownFor(key knownKey, pid int, uid uint32) *knownPeer {
	imports.mu.Lock()
	defer imports.mu.Unlock()
	kp := d.known[key]
	if kp == nil || kp.pid != pid || kp.uid != uid || !kp.until.After(time.Now()) {
		return nil
	}
	im, in := imports.bySeg[kp.tseg], notifiers.byN[kp.note]
	if im == nil || in == nil {
		return nil
	}
	if _, err := im.ref(0); err != nil {
		return nil
	}
	if in.parked != nil {
		delete(in.parked.parked.notes, in)
		in.parked = nil
	}
	in.refs++
	kp.until = time.Now().Add(importLinger)
	d.armSweepLocked(kp.until)
	return kp
}

// forget drops the answer remembered for key, if it is still kp.
func (d *Device) forget(key knownKey, kp *knownPeer) {
	imports.mu.Lock()
	if d.known[key] != kp {
		imports.mu.Unlock()
		return
	}
	delete(d.known, key)
	imports.mu.Unlock()
	kp.release()
}

// sweepKnownLocked removes the answers whose time is up (all of them once
// d is closed) and returns them, for the caller to release their
// references without the lock; it lowers *next to the time left of the
// others. The caller holds imports.mu.
func (d *Device) sweepKnownLocked(now time.Time, next *time.Duration) []*knownPeer {
	var gone []*knownPeer
	for k, kp := range d.known {
		if d.parked.closed || !kp.until.After(now) {
			delete(d.known, k)
			gone = append(gone, kp)
			continue
		}
		if left := kp.until.Sub(now); *next < 0 || left < *next {
			*next = left
		}
	}
	return gone
}

// dialEarly builds the queue pair of a dial to the listener that gave
// kp, sends the hello, and returns: the connection reader takes the
// reply. It owns seg and kp's references.
// The caller holds one of maxEarlyOut (reserveEarly) until takeReply.
func (d *Device) dialEarly(conn *net.UnixConn, opts QPOptions, seg *shm.Segment, capacity int, kp *knownPeer, own func(*QueuePair)) (*QueuePair, error) {
	qp, err := d.dialEarlyOut(conn, opts, seg, capacity, kp, own)
	if err != nil {
		d.earlyOut.Add(-1)
	}
	return qp, err
}

// maxEarlyOut bounds a device's early dials in flight: a dial beyond it
// waits for its reply, as a first dial does. A process that dials
// thousands at once would otherwise have the listener run as many
// handshakes at once, and their system calls, among that many runnable
// goroutines, each take an OS thread from the Go scheduler
// (docs/setup.md).
const maxEarlyOut = 8

// testHookEarlyReserve, if set, sees each early dial's reservation.
var testHookEarlyReserve func(reserved bool)

// reserveEarly takes one of the device's maxEarlyOut early dials, if one
// is free.
func (d *Device) reserveEarly() bool {
	for {
		n := d.earlyOut.Load()
		if n >= maxEarlyOut {
			return false
		}
		if d.earlyOut.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// heldFiles are a listener's registration table and hub table as files,
// which a dialer that holds them names in its hello (cmFlagHeld).
type heldFiles struct{ table, hub shm.FileID }

// heldOf returns the files of kp's table and hub, if the listener speaks
// the version that takes them named; nil otherwise.
func heldOf(kp *knownPeer) *heldFiles {
	if kp.version < cmHeldVersion {
		return nil
	}
	return &kp.files
}

func (d *Device) dialEarlyOut(conn *net.UnixConn, opts QPOptions, seg *shm.Segment, capacity int, kp *knownPeer, own func(*QueuePair)) (*QueuePair, error) {
	held := heldOf(kp)
	if err := d.sendHello(conn, opts, seg, capacity, held); err != nil {
		seg.Close()
		releaseImport(kp.tseg)
		releaseNotifier(kp.note)
		return nil, err
	}
	qp, err := d.attachQP(conn, opts, true, qpFiles{seg: seg, qp: -1}, capacity, kp.note, kp.tseg, kp.table)
	if err != nil {
		releaseNotifier(kp.note)
		return nil, err
	}
	own(qp) // the segment's fd: dropped, or kept for reuse (qppool.go)
	qp.peer.pid, qp.peer.uid, qp.peer.attr, qp.peer.version, qp.peer.private = kp.pid, kp.uid, kp.attr, kp.version, kp.reply
	qp.awaiting = kp
	qp.awaitNamed = held != nil
	qp.awaitKey = knownKey{addr: conn.RemoteAddr().String(), hello: string(opts.PrivateData)}
	qp.awaitBy = time.Now().Add(opts.Timeout) // takeReply's deadline
	conn.SetDeadline(time.Time{})
	d.start(qp)
	return qp, nil
}

// Early tells whether the queue pair was dialed early: on the answer its
// listener gave before, its reply checked when it comes.
func (qp *QueuePair) Early() bool { return qp.awaiting != nil }

// Taken tells whether the listener has taken the queue pair: it answered
// (an accept, or a dial that waited for the reply), or an early dial's
// reply came and matched. What a taken queue pair's side committed to its
// ring is delivered after that side hangs up, before the end; an early
// dial that hangs up before its reply may never be accepted.
func (qp *QueuePair) Taken() bool { return qp.awaiting == nil || qp.replied.Load() }

// takeReply reads and checks an early dial's reply, if qp is one: the
// remembered answer from the same table and hub files, or an error that
// says what came instead (a reject's reason among them).
func (qp *QueuePair) takeReply() error {
	kp := qp.awaiting
	if kp == nil {
		return nil
	}
	defer qp.dev.earlyOut.Add(-1) // dialEarly's
	qp.conn.SetReadDeadline(qp.awaitBy)
	buf := make([]byte, cmRecvSize)
	n, fds, err := sys.RecvFds(qp.conn, buf, cmMaxFds)
	qp.conn.SetReadDeadline(time.Time{})
	if err != nil {
		err = fmt.Errorf("%w: handshake reply: %v", ErrProtocol, err)
	} else {
		err = checkReply(buf[:n], fds, kp, qp.awaitNamed)
	}
	sys.CloseAll(fds)
	if err != nil {
		qp.dev.forget(qp.awaitKey, kp)
	} else {
		// Not under sqMu: a copy into the peer's memory holds it while it
		// waits for the segment's announcement, which this reader reads
		// next (peerInfo.segment).
		qp.heldReply.Store(len(fds) == 0)
		qp.replied.Store(true)
	}
	return err
}

// checkReply checks an early dial's reply b, with fds, against kp.
func checkReply(b []byte, fds []int, kp *knownPeer, named bool) error {
	r, err := parseReply(b, len(fds))
	if err != nil {
		return err
	}
	if v, err := negotiate(r); err != nil || v != kp.version || r.attr() != kp.attr || !bytes.Equal(r.private, kp.reply) {
		return fmt.Errorf("%w: the listener answered otherwise than before (version %d, %+v, %d bytes of private data)", ErrProtocol, r.maxVer, r.attr(), len(r.private))
	}
	if r.flags&cmFlagHeld != 0 {
		if !named {
			return fmt.Errorf("%w: a reply without fds to a hello that named none", ErrProtocol)
		}
		return nil // the listener says the files we named are its own
	}
	table, terr := shm.FileIDOf(fds[0])
	hub, herr := shm.FileIDOf(fds[1])
	if terr != nil || herr != nil || table != kp.files.table || hub != kp.files.hub {
		return fmt.Errorf("%w: the listener answered with another registration table or hub than before", ErrProtocol)
	}
	return nil
}
