package nic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sandirect/sandirect/internal/gopool"
	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/quiesce"
	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
)

// Connection manager. A connection is a SOCK_SEQPACKET Unix socket (a path,
// or "@name" for the abstract namespace) that lives as long as the queue
// pair: the handshake passes the shared segments over it (SCM_RIGHTS),
// later messages announce new memory segments, and its hang-up tells the
// survivor that the peer is gone. docs/nic.md describes the messages.

// negotiate picks the highest version both sides speak.
func negotiate(h hello) (uint16, error) {
	v := min(h.maxVer, cmVersion)
	if v < max(h.minVer, cmMinVersion) {
		return 0, fmt.Errorf("%w: peer speaks versions [%d, %d], we speak [%d, %d]", ErrRefused, h.minVer, h.maxVer, cmMinVersion, cmVersion)
	}
	return v, nil
}

func (d *Device) hello(ringCapacity int, private []byte) hello {
	h := hello{
		private:      private,
		minVer:       cmMinVersion,
		maxVer:       cmVersion,
		maxInline:    uint32(d.attr.MaxInline),
		maxRegions:   uint32(d.attr.MaxRegions),
		ringCapacity: uint32(ringCapacity),
		maxSend:      uint32(d.attr.MaxSend),
	}
	if d.attr.RDMARead {
		h.flags |= cmFlagRead
	}
	return h
}

func (h hello) attr() Attr {
	return Attr{
		RDMARead:   h.flags&cmFlagRead != 0,
		MaxInline:  int(h.maxInline),
		MaxRegions: int(h.maxRegions),
		MaxSend:    int(h.maxSend),
	}
}

// QPOptions configures a queue pair at connect.
type QPOptions struct {
	SendCQ, RecvCQ *CompletionQueue // required
	// InPlace makes the queue pair's sends and receives the owner's, in
	// the rings themselves (inplace.go): it reads incoming sends where
	// they lie and writes its sends there, serializing each direction
	// itself, and the queue pair takes no lock for them. PostRecv, and
	// PostSend of OpSend, are refused; RDMA Read and Write work as usual.
	InPlace bool
	// Timeout bounds the handshake; zero means 10 s.
	Timeout time.Duration
	// PrivateData travels with the handshake, at most MaxPrivateData
	// bytes, as RDMA CM's private data does: a dialer's with its request,
	// a listener's with its reply. The peer reads it with
	// QueuePair.PeerPrivateData. A layer above can so settle its own
	// parameters in the same round trip.
	PrivateData []byte
	// Early, on a dialer, returns from the dial once the hello is sent
	// when the listener at this address, in the same process, answered
	// this same hello before (QueuePair.Early): the queue pair runs on
	// that answer — the listener's table, hub, attributes and private
	// data — and its connection reader checks the reply when it comes. A
	// reject or any other answer fails the queue pair, with the reason,
	// and the listener is forgotten.
	Early bool
	// Answer, on a listener, sees the dialer's private data after the
	// policy and the request passed their checks and returns the reply's
	// private data, in place of PrivateData. An error refuses the dialer,
	// its text the reason it reads. It runs on the handshake's goroutine.
	Answer func(dialer []byte) (reply []byte, err error)
}

func (o *QPOptions) check() error {
	if o.SendCQ == nil || o.RecvCQ == nil {
		return errors.New("nic: QPOptions needs a send and a receive CQ")
	}
	if len(o.PrivateData) > MaxPrivateData {
		return fmt.Errorf("nic: %d bytes of private data, more than %d", len(o.PrivateData), MaxPrivateData)
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	return nil
}

// Listener accepts queue-pair connections on a Unix socket.
type Listener struct {
	d  *Device
	ln *net.UnixListener
}

// Listen listens on a Unix socket path, or on an abstract name written as
// "@name".
func (d *Device) Listen(addr string) (*Listener, error) {
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("nic: listen: %w", err)
	}
	return &Listener{d: d, ln: ln}, nil
}

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening.
func (l *Listener) Close() error { return l.ln.Close() }

// Accept waits for a connection and completes its handshake. A peer that
// fails the policy or the handshake is refused and Accept returns an error
// matching ErrRefused or ErrProtocol; the listener keeps working. A peer
// that stays silent holds Accept up to opts.Timeout: see AcceptPending.
func (l *Listener) Accept(opts QPOptions) (*QueuePair, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	p, err := l.AcceptPending()
	if err != nil {
		return nil, err
	}
	return p.Handshake(opts)
}

// Pending is a connection taken by AcceptPending whose handshake has not
// run yet.
type Pending struct {
	d    *Device
	conn *net.UnixConn

	mu             lockrank.Mutex // guards handed, closed
	handed, closed bool           // the queue pair owns conn; Close closed it
}

// AcceptPending waits for a connection and returns it before its
// handshake, so that the caller can run handshakes concurrently: a peer
// that never completes its handshake then holds up only its own, not the
// listener.
func (l *Listener) AcceptPending() (*Pending, error) {
	conn, err := l.ln.AcceptUnix()
	if err != nil {
		if errors.Is(err, net.ErrClosed) {
			return nil, fmt.Errorf("nic: accept: %w", ErrClosed)
		}
		return nil, fmt.Errorf("nic: accept: %w", err)
	}
	p := &Pending{d: l.d, conn: conn}
	p.mu.Init(lockrank.NICPending)
	return p, nil
}

// Handshake completes the connection's handshake, as Accept does. On
// failure the connection is closed.
func (p *Pending) Handshake(opts QPOptions) (*QueuePair, error) {
	if err := opts.check(); err != nil {
		p.conn.Close()
		return nil, err
	}
	qp, err := p.d.accept(p.conn, opts)
	if err != nil {
		p.conn.Close()
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		// Closed after its lock: qp.Close takes the device's lock, which
		// ranks before Pending.mu (docs/locking.md).
		p.mu.Unlock()
		qp.Close()
		return nil, fmt.Errorf("nic: accept: %w", ErrClosed)
	}
	p.handed = true
	p.mu.Unlock()
	return qp, nil
}

// Close abandons the connection: a Handshake in progress fails at once.
// After a successful Handshake it does nothing (the queue pair owns the
// connection).
func (p *Pending) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.handed || p.closed {
		return nil
	}
	p.closed = true
	return p.conn.Close()
}

// checkPeer checks the peer's credentials against our policy, the
// listener's or the dialer's (side).
func (d *Device) checkPeer(conn *net.UnixConn, side string) (pid int, uid uint32, err error) {
	p, u, _, err := sys.PeerCred(conn)
	if err != nil {
		return 0, 0, fmt.Errorf("nic: peer credentials: %w", err)
	}
	if u != uint32(os.Getuid()) && !slices.Contains(d.cfg.AllowUIDs, u) {
		return 0, 0, fmt.Errorf("%w: uid %d not allowed by the %s policy (peer pid %d)", ErrRefused, u, side, p)
	}
	return int(p), u, nil
}

// reject tells the dialer why we refuse it. (The dialer prefixes
// ErrRefused itself.)
func reject(conn *net.UnixConn, reason error) {
	h := rejectHello(strings.TrimPrefix(reason.Error(), ErrRefused.Error()+": "))
	conn.Write(h.marshal())
}

func (d *Device) accept(conn *net.UnixConn, opts QPOptions) (*QueuePair, error) {
	conn.SetDeadline(time.Now().Add(opts.Timeout))
	pid, uid, err := d.checkPeer(conn, "listener's")
	if err != nil {
		// Take the dialer's hello first: a socket closed with it unread
		// resets the dialer, which would never read the reason.
		if _, fds, rerr := sys.RecvFds(conn, make([]byte, cmRecvSize), cmMaxFds); rerr == nil {
			sys.CloseAll(fds)
		}
		reject(conn, err)
		return nil, err
	}
	buf := make([]byte, cmRecvSize)
	n, fds, err := sys.RecvFds(conn, buf, cmMaxFds)
	if err != nil {
		return nil, fmt.Errorf("%w: handshake: %v", ErrProtocol, err)
	}
	h, err := parseRequest(buf[:n], len(fds))
	var ver uint16
	if err == nil {
		ver, err = negotiate(h)
	}
	private := opts.PrivateData
	if err == nil && opts.Answer != nil {
		private, err = answer(opts.Answer, h.private)
	}
	if err != nil {
		sys.CloseAll(fds)
		reject(conn, err)
		return nil, err
	}
	qp, err := d.newQP(conn, opts, false, qpFiles{qp: fds[0], table: fds[1], hubTable: fds[2], hubPipe: fds[3]}, int(h.ringCapacity))
	if err != nil {
		reject(conn, err)
		return nil, err
	}
	qp.peer.pid, qp.peer.uid, qp.peer.attr, qp.peer.version = pid, uid, h.attr(), ver
	qp.peer.private = h.private
	reply := d.hello(0, private)
	hubTable, hubEvent := d.hub.Fds()
	pass := []int{d.regSeg.Fd(), hubTable, hubEvent}
	if h.flags&cmFlagHeld != 0 && ver >= cmHeldVersion && d.ownFiles(h.heldTable, h.heldHub) {
		// The dialer holds them from an earlier reply: it named them,
		// and they are ours, so nothing needs passing again.
		reply.flags |= cmFlagHeld
		pass = nil
	}
	if err := sys.SendFds(conn, reply.marshal(), pass...); err != nil {
		qp.Close()
		return nil, fmt.Errorf("nic: handshake reply: %w", err)
	}
	conn.SetDeadline(time.Time{})
	d.start(qp)
	return qp, nil
}

// answer runs a listener's Answer on the dialer's private data.
func answer(f func([]byte) ([]byte, error), dialer []byte) ([]byte, error) {
	reply, err := f(dialer)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrRefused, err)
	case len(reply) > MaxPrivateData:
		return nil, fmt.Errorf("nic: answer of %d bytes of private data, more than %d", len(reply), MaxPrivateData)
	}
	return reply, nil
}

// Dial connects a queue pair to the listener at addr.
func (d *Device) Dial(addr string, opts QPOptions) (*QueuePair, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("nic: dial %s: %w", addr, err)
	}
	return d.DialConn(conn, opts)
}

// DialConn is Dial over conn, a "unixpacket" connection to a listener that
// the caller made itself: connecting first tells, before a device exists,
// whether anyone listens there. DialConn owns conn; it closes it on
// failure.
func (d *Device) DialConn(conn *net.UnixConn, opts QPOptions) (*QueuePair, error) {
	if err := opts.check(); err != nil {
		conn.Close()
		return nil, err
	}
	qp, err := d.dial(conn, opts)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return qp, nil
}

func (d *Device) dial(conn *net.UnixConn, opts QPOptions) (*QueuePair, error) {
	conn.SetDeadline(time.Now().Add(opts.Timeout))
	pid, uid, err := d.checkPeer(conn, "dialer's")
	if err != nil {
		return nil, err
	}
	capacity := d.cfg.RingCapacity
	key := knownKey{addr: conn.RemoteAddr().String(), hello: string(opts.PrivateData)}
	pool := qpPoolKey{addr: key.addr, pid: pid}
	seg, kept, reused, err := d.qpSegment(pool, capacity) // qppool.go
	if err != nil {
		return nil, err
	}
	// The peer has its own fd of the segment once the hello is out: ours
	// goes, unless it is kept for the segment's next queue pair.
	own := func(qp *QueuePair) {
		if !kept {
			seg.DropFd()
			return
		}
		qp.poolKey, qp.segCap = &pool, capacity
		if reused {
			qp.sstats.SegmentsReused = 1
		}
	}
	fail := func(err error) (*QueuePair, error) {
		seg.Close() // it may be closed already
		if kept {
			d.qpKept.Add(-1)
		}
		return nil, err
	}
	if opts.Early {
		reserved := d.reserveEarly() // known.go
		if testHookEarlyReserve != nil {
			testHookEarlyReserve(reserved)
		}
		if reserved {
			if kp := d.knownFor(key, pid, uid); kp != nil {
				qp, err := d.dialEarly(conn, opts, seg, capacity, kp, own)
				if err != nil {
					return fail(err)
				}
				return qp, nil
			}
			d.earlyOut.Add(-1)
		}
	}
	qp, err := d.dialSegment(conn, opts, seg, capacity)
	if err != nil {
		return fail(err)
	}
	own(qp)
	qp.peer.pid, qp.peer.uid = pid, uid
	if opts.Early {
		d.learn(key, qp) // known.go
	}
	conn.SetDeadline(time.Time{})
	d.start(qp)
	return qp, nil
}

// newQPSegment creates a queue pair's segment for rings of capacity
// bytes, its header and both rings initialized.
func newQPSegment(capacity int) (*shm.Segment, error) {
	// Lazy: an idle connection touches a page or two of its rings.
	seg, err := shm.CreateSegmentLazy("qp", kindQP, qpSegmentSize(capacity))
	if err != nil {
		return nil, err
	}
	mem := seg.Bytes()
	binary.LittleEndian.PutUint32(mem[qpMagicOff:], qpMagic)
	binary.LittleEndian.PutUint32(mem[qpVersionOff:], qpVersion)
	binary.LittleEndian.PutUint32(mem[qpCapacityOff:], uint32(capacity))
	for i := range 2 {
		r, err := seg.Region(qpRingsOff+i*shm.RingSize(capacity), shm.RingSize(capacity))
		if err == nil {
			err = shm.InitZeroedRing(r, capacity) // a fresh segment
		}
		if err != nil {
			seg.Close()
			return nil, err
		}
	}
	return seg, nil
}

// ownFiles tells whether table and hub are this device's registration
// table and hub table.
func (d *Device) ownFiles(table, hub shm.FileID) bool {
	d.ownOnce.Do(func() {
		t, terr := shm.FileIDOf(d.regSeg.Fd())
		hubTable, _ := d.hub.Fds()
		h, herr := shm.FileIDOf(hubTable)
		if terr == nil && herr == nil {
			d.ownTable, d.ownHub = t, h
		}
	})
	return d.ownTable != (shm.FileID{}) && table == d.ownTable && hub == d.ownHub
}

// sendHello sends the dialer's hello with seg, the queue pair's segment.
// held, if not nil, names the listener's files the dialer holds (kp's).
func (d *Device) sendHello(conn *net.UnixConn, opts QPOptions, seg *shm.Segment, capacity int, held *heldFiles) error {
	h := d.hello(capacity, opts.PrivateData)
	if held != nil {
		h.flags |= cmFlagHeld
		h.heldTable, h.heldHub = held.table, held.hub
	}
	hubTable, hubEvent := d.hub.Fds()
	if err := sys.SendFds(conn, h.marshal(), seg.Fd(), d.regSeg.Fd(), hubTable, hubEvent); err != nil {
		return fmt.Errorf("nic: handshake: %w", err)
	}
	return nil
}

// dialSegment sends the hello with seg, the new queue pair's, and
// completes the handshake; the queue pair keeps this mapping.
func (d *Device) dialSegment(conn *net.UnixConn, opts QPOptions, seg *shm.Segment, capacity int) (*QueuePair, error) {
	if err := d.sendHello(conn, opts, seg, capacity, nil); err != nil {
		return nil, err
	}
	buf := make([]byte, cmRecvSize)
	n, fds, err := sys.RecvFds(conn, buf, cmMaxFds)
	if err != nil {
		return nil, fmt.Errorf("%w: handshake reply: %v", ErrProtocol, err)
	}
	r, err := parseReply(buf[:n], len(fds))
	if err == nil && r.flags&cmFlagHeld != 0 {
		err = fmt.Errorf("%w: a reply without fds to a hello that named none", ErrProtocol)
	}
	var ver uint16
	if err == nil {
		ver, err = negotiate(r)
	}
	if err != nil {
		sys.CloseAll(fds)
		return nil, err
	}
	qp, err := d.newQP(conn, opts, true, qpFiles{seg: seg, qp: -1, table: fds[0], hubTable: fds[1], hubPipe: fds[2]}, capacity)
	if err != nil {
		return nil, err
	}
	qp.peer.attr, qp.peer.version, qp.peer.private = r.attr(), ver, r.private
	return qp, nil
}

// qpFiles are what a queue pair is made of: its segment, mapped (the
// dialer's) or as an fd (the acceptor's), and the peer's registration
// table and wake hub.
type qpFiles struct {
	seg                          *shm.Segment // nil: map qp
	qp, table, hubTable, hubPipe int
}

// closeQP closes the queue pair's segment, mapped or not.
func (f *qpFiles) closeQP() {
	if f.seg != nil {
		f.seg.Close()
		return
	}
	sys.Close(f.qp)
}

// newQP maps the queue pair segment, the peer's registration table and
// its wake hub (taking ownership of them all) and attaches to the rings.
func (d *Device) newQP(conn *net.UnixConn, opts QPOptions, dialer bool, f qpFiles, capacity int) (*QueuePair, error) {
	note, err := importNotifier(f.hubTable, f.hubPipe)
	if err != nil {
		f.closeQP()
		sys.Close(f.table)
		return nil, fmt.Errorf("%w: peer wake hub: %v", ErrProtocol, err)
	}
	qp, err := d.mapQP(conn, opts, dialer, f, capacity, note)
	if err != nil {
		releaseNotifier(note)
	}
	return qp, err
}

// mapQP is newQP once the peer's hub is open.
func (d *Device) mapQP(conn *net.UnixConn, opts QPOptions, dialer bool, f qpFiles, capacity int, note *shm.Notifier) (*QueuePair, error) {
	tseg, err := importSegment(f.table, kindRegTable, regEntriesStart, true)
	if err != nil {
		f.closeQP()
		return nil, fmt.Errorf("%w: peer registration table: %v", ErrProtocol, err)
	}
	if !tseg.WritesSealed() {
		// Anyone else holding the fd could rewrite the keys we check.
		releaseImport(tseg)
		f.closeQP()
		return nil, fmt.Errorf("%w: peer registration table not sealed against writes", ErrProtocol)
	}
	table, err := validateTable(tseg)
	if err != nil {
		f.closeQP()
		releaseImport(tseg)
		return nil, err
	}
	return d.attachQP(conn, opts, dialer, f, capacity, note, tseg, table)
}

// attachQP is mapQP once the peer's table is mapped and checked; on
// failure it releases tseg and the queue pair's segment.
func (d *Device) attachQP(conn *net.UnixConn, opts QPOptions, dialer bool, f qpFiles, capacity int, note *shm.Notifier, tseg *shm.Segment, table peerTable) (*QueuePair, error) {
	var err error
	seg := f.seg
	imported := seg == nil
	if imported {
		// The dialer's segment, or the mapping of it an earlier queue pair
		// on it parked (qppool.go).
		if seg, err = importSegment(f.qp, kindQP, qpSegmentSize(capacity), false); err != nil {
			releaseImport(tseg)
			return nil, fmt.Errorf("%w: queue pair segment: %v", ErrProtocol, err)
		}
	}
	fail := func(err error) (*QueuePair, error) {
		if imported {
			releaseImport(seg)
		} else {
			seg.Close()
		}
		releaseImport(tseg)
		return nil, fmt.Errorf("%w: queue pair segment: %v", ErrProtocol, err)
	}
	mem := seg.Bytes()
	if m, v, c := shm.LoadUint32(mem, qpMagicOff), shm.LoadUint32(mem, qpVersionOff), shm.LoadUint32(mem, qpCapacityOff); m != qpMagic || v != qpVersion || int(c) != capacity {
		return fail(fmt.Errorf("header magic %#x version %d capacity %d", m, v, c))
	}
	r0, err0 := seg.Region(qpRingsOff, shm.RingSize(capacity))
	r1, err1 := seg.Region(qpRingsOff+shm.RingSize(capacity), shm.RingSize(capacity))
	if err := errors.Join(err0, err1); err != nil {
		return fail(err)
	}
	outR, inR := r1, r0
	if dialer {
		outR, inR = r0, r1
	}
	out, err := shm.NewProducer(outR, d.cfg.Wait)
	if err != nil {
		return fail(err)
	}
	in, err := shm.NewConsumer(inR, d.cfg.Wait)
	if err != nil {
		return fail(err)
	}
	// Neither ring parks on its own: the receive CQ's waiter sleeps on the
	// incoming ring (WaitSet) and the engine retries a full outgoing ring.
	out.SetWake(nil, note)
	in.SetWake(nil, note)
	qp := &QueuePair{
		note:        note,
		dev:         d,
		sendCQ:      opts.SendCQ,
		recvCQ:      opts.RecvCQ,
		inPlace:     opts.InPlace,
		conn:        conn,
		seg:         seg,
		segImported: imported,
		out:         out,
		in:          in,
		readerDone:  make(chan struct{}),
	}
	qp.sqMu.Init(lockrank.QPSend)
	qp.rqMu.Init(lockrank.QPRecv)
	qp.connMu.Init(lockrank.QPConn)
	qp.peer.segMu.Init(lockrank.PeerSegments)
	qp.retireMu.Init(lockrank.QPRetire)
	qp.inlineMax = min(d.attr.MaxInline, out.MaxPayload())
	qp.peer.table = table
	qp.peer.tableSeg = tseg
	qp.peer.segs = map[uint32]*shm.Segment{}
	qp.peer.segChanged = make(chan struct{})
	return qp, nil
}

func validateTable(seg *shm.Segment) (peerTable, error) {
	mem := seg.Bytes()
	magic := shm.LoadUint32(mem, regMagicOff)
	version := shm.LoadUint32(mem, regVersionOff)
	entries := shm.LoadUint32(mem, regEntriesOff)
	size := shm.LoadUint32(mem, regEntrySizeOff)
	switch {
	case magic != regMagic || version != regVersion || size != entrySize:
		return peerTable{}, fmt.Errorf("%w: registration table magic %#x version %d entry size %d", ErrProtocol, magic, version, size)
	case entries == 0 || entries > maxRegEntries || regTableSize(int(entries)) > len(mem):
		return peerTable{}, fmt.Errorf("%w: registration table of %d entries in %d bytes", ErrProtocol, entries, len(mem))
	}
	return peerTable{mem: mem, entries: int(entries)}, nil
}

// start makes a connected queue pair live: ready state, receive CQ, reader
// of the connection socket, and the announcement of our memory segments.
func (d *Device) start(qp *QueuePair) {
	qp.state.Store(uint32(QPReady))
	qp.recvCQ.attach(qp)
	qp.sendCQ.attachSend(qp)
	d.mu.Lock()
	closed := d.closed
	if !closed {
		d.qps[qp] = struct{}{}
	}
	segs := make([]*memSegment, 0, len(d.memSegs))
	for _, ms := range d.memSegs {
		segs = append(segs, ms)
	}
	d.mu.Unlock()
	qp.started.Store(true)
	gopool.Go(qp.readConn)
	if closed {
		qp.Close()
		return
	}
	for _, ms := range segs {
		qp.announceSegment(ms)
	}
}

// announceSegment sends one of our memory segments to the peer, or, to a
// peer of another uid than the segment's, its number alone: the peer then
// fails RDMA on it at once instead of waiting for the segment.
func (qp *QueuePair) announceSegment(ms *memSegment) {
	qp.connMu.Lock()
	defer qp.connMu.Unlock()
	if ms.freed.Load() {
		return // Free came first; its retraction found nothing to retract
	}
	if qp.announced == nil {
		qp.announced = map[uint32]struct{}{}
	}
	qp.announced[ms.idx] = struct{}{}
	// A failure means the connection is gone; the reader reports that.
	if qp.peer.uid != ms.uid {
		msg := cmMsg{typ: cmSegDeny, idx: ms.idx}.marshal()
		sys.SendFds(qp.conn, msg[:])
		return
	}
	msg := cmMsg{typ: cmSegAdd, idx: ms.idx}.marshal()
	sys.SendFds(qp.conn, msg[:], ms.seg.Fd())
}

// retractSegment tells the peer that our memory segment idx is freed, so
// that it unmaps it (SEG_DEL), if the segment was announced to it: Free
// marks the segment freed before it retracts it, and announceSegment
// checks the mark under the same lock, so every announcement is either
// retracted or never sent. A version 1 peer keeps its mapping until the
// queue pair closes.
func (qp *QueuePair) retractSegment(idx uint32) {
	msg := cmMsg{typ: cmSegDel, idx: idx}.marshal()
	qp.connMu.Lock()
	defer qp.connMu.Unlock()
	if _, ok := qp.announced[idx]; !ok {
		return
	}
	delete(qp.announced, idx)
	if qp.peer.version >= 2 {
		sys.SendFds(qp.conn, msg[:]) // a failure: the reader reports it
	}
}

// maxPeerSegments bounds the segments a peer may announce on one queue
// pair: a SEG_DENY costs the peer 8 bytes and us a map entry, so without
// a bound a peer could grow our memory at will.
const maxPeerSegments = 1 << 16

// deniedSegment stands in a queue pair's segment map for a peer segment
// not shared with us.
var deniedSegment = new(shm.Segment)

// dropPeerSegment forgets the peer's memory segment idx on its SEG_DEL
// and unmaps it once no copy can be using it: copies to and from peer
// segments run under sqMu, which the reader must not wait for itself (a
// copy under it may be waiting for the reader's next announcement).
func (qp *QueuePair) dropPeerSegment(idx uint32) error {
	qp.peer.segMu.Lock()
	if qp.peer.segs == nil {
		qp.peer.segMu.Unlock()
		return nil // closing
	}
	seg := qp.peer.segs[idx]
	delete(qp.peer.segs, idx)
	qp.peer.unhotLocked(idx)
	qp.peer.segMu.Unlock()
	switch seg {
	case nil:
		return fmt.Errorf("%w: SEG_DEL of memory segment %d, never announced", ErrProtocol, idx)
	case deniedSegment:
		return nil
	}
	qp.retireMu.Lock()
	if qp.retiring == 0 {
		qp.retired = make(chan struct{})
	}
	qp.retiring++
	qp.retireMu.Unlock()
	go func() {
		quiesce.Wait(&qp.sqMu) // copies into seg under way end first
		releaseImport(seg)
		qp.retireMu.Lock()
		if qp.retiring--; qp.retiring == 0 {
			close(qp.retired)
		}
		qp.retireMu.Unlock()
	}()
	return nil
}

// readMessages serves the peer's control messages until the connection
// hangs up or breaks the protocol, and returns why it ended.
func (qp *QueuePair) readMessages() error {
	buf := make([]byte, cmMsgSize+1)
	for {
		n, fds, err := sys.RecvFds(qp.conn, buf, 2)
		if err != nil || n == 0 {
			sys.CloseAll(fds)
			return ErrPeerGone
		}
		m, err := parseCMMsg(buf[:n], len(fds), qp.peer.version)
		if err != nil {
			sys.CloseAll(fds)
			return err
		}
		if m.typ == cmSegDel {
			if err := qp.dropPeerSegment(m.idx); err != nil {
				return err
			}
			continue
		}
		seg := deniedSegment
		if m.typ == cmSegAdd {
			if seg, err = importSegment(fds[0], kindMemory, memDataOff+1, false); err != nil {
				return fmt.Errorf("%w: memory segment %d: %v", ErrProtocol, m.idx, err)
			}
		}
		qp.peer.segMu.Lock()
		full := len(qp.peer.segs) >= maxPeerSegments
		if qp.peer.segs == nil || qp.peer.segs[m.idx] != nil || full {
			releaseImport(seg) // closing, announced twice, or too many
		} else {
			qp.peer.segs[m.idx] = seg
			close(qp.peer.segChanged)
			qp.peer.segChanged = make(chan struct{})
		}
		qp.peer.segMu.Unlock()
		if full {
			return fmt.Errorf("%w: more than %d memory segments announced", ErrProtocol, maxPeerSegments)
		}
	}
}

// awaitRetired waits until the peer segments dropped so far are unmapped.
func (qp *QueuePair) awaitRetired() {
	qp.retireMu.Lock()
	n, done := qp.retiring, qp.retired
	qp.retireMu.Unlock()
	if n > 0 {
		<-done
	}
}

// readConn serves the connection socket until it hangs up, then fails the
// queue pair: the peer closed it or died.
func (qp *QueuePair) readConn() {
	defer close(qp.readerDone)
	reason := qp.takeReply() // known.go: an early dial's reply
	if reason == nil {
		reason = qp.readMessages()
	}
	qp.peer.segMu.Lock()
	if qp.peer.segChanged != nil {
		close(qp.peer.segChanged)
		qp.peer.segChanged = nil
	}
	qp.peer.segMu.Unlock()
	// Sends the peer committed before it went are delivered first, as far
	// as receives are posted: a hang-up must not overtake data.
	qp.progressRecv()
	if qp.setError(reason) {
		qp.flush()
	}
}
