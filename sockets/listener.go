package sockets

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/gopool"
	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/nic"
)

// ListenConfig creates listeners. The zero value uses DefaultConfig.
type ListenConfig struct {
	// Config configures the accepted connections; nil means
	// DefaultConfig().
	Config *Config
}

// Listen listens on network and address with the default configuration:
// see ListenConfig.Listen.
func Listen(network, address string) (net.Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Listen listens on address:
//
//   - "sandirect": a Unix socket path or an "@abstract" name; it accepts
//     shared-memory connections only.
//   - "tcp", "tcp4", "tcp6": host:port. It listens on TCP and, for dialers
//     on this host, on the shared-memory name of the port; Accept returns
//     connections of both kinds (*Conn and *net.TCPConn).
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	cfg, err := resolve(lc.Config)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	l := &Listener{cfg: cfg, netw: network, conns: make(chan net.Conn), done: make(chan struct{})}
	l.pmu.Init(lockrank.ListenerPending)
	var name string
	switch network {
	case "sandirect":
		name = address
		l.addr = &Addr{Net: network, Name: address}
	case "tcp", "tcp4", "tcp6":
		var nlc net.ListenConfig
		tl, err := nlc.Listen(ctx, network, address)
		if err != nil {
			return nil, err
		}
		l.tl = tl
		l.addr = tl.Addr()
		name = tcpName(tl.Addr().(*net.TCPAddr).Port)
		noListener.forget(name) // dialers of this process find us at once
	default:
		return nil, &net.OpError{Op: "listen", Net: network, Err: fmt.Errorf("%w %q", ErrUnknownNetwork, network)}
	}
	err = l.listenSHM(name)
	if err != nil {
		if l.tl == nil {
			return nil, &net.OpError{Op: "listen", Net: network, Addr: l.addr, Err: err}
		}
		// TCP alone: the shared-memory name is taken or unusable.
	}
	if l.nl != nil {
		l.wg.Add(1)
		go l.acceptSHM()
	}
	if l.tl != nil {
		l.wg.Add(1)
		go l.acceptTCP()
	}
	return l, nil
}

// listenSHM opens the device and listens on the connection manager's
// name. A path whose socket file was left by a listener that died (killed
// by a signal, it could not unlink it) is taken over: see clearStale.
func (l *Listener) listenSHM(name string) error {
	unlock := lockDir(name)
	defer unlock()
	if err := clearStale(name); err != nil {
		return err
	}
	d, err := acquireDevice(&l.cfg)
	if err != nil {
		return err
	}
	l.nl, err = d.nic.Listen(name)
	if err != nil {
		d.release()
		return err
	}
	l.dev = d
	return nil
}

// isPath tells whether a connection manager name is a file system path
// rather than an abstract name.
func isPath(name string) bool { return name != "" && name[0] != '@' }

// lockDir takes an exclusive flock on the directory of the path name, so
// that listeners of this package that start together on one stale path do
// not unlink each other's fresh socket; it returns the unlock. Without the
// lock (an abstract name, a directory we cannot open) it does nothing.
func lockDir(name string) (unlock func()) {
	nothing := func() {}
	if !isPath(name) {
		return nothing
	}
	dir, err := os.Open(filepath.Dir(name))
	if err != nil {
		return nothing
	}
	if err := syscall.Flock(int(dir.Fd()), syscall.LOCK_EX); err != nil {
		dir.Close()
		return nothing
	}
	return func() { dir.Close() } // closing the only fd releases the lock
}

// clearStale unlinks the socket file at path when nobody listens on it:
// a connect is refused. A live listener (the connect succeeds, or finds a
// socket of another type) and anything but a socket are left alone, and
// the bind that follows fails with EADDRINUSE. The caller holds lockDir.
func clearStale(path string) error {
	if !isPath(path) {
		return nil
	}
	before, err := os.Lstat(path)
	if err != nil || before.Mode()&os.ModeSocket == 0 {
		return nil // nothing there, or not ours to remove: bind says why
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err == nil {
		c.Close() // someone listens: never steal the name
		return nil
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	// Still the file we probed, not one a listener made meanwhile.
	if now, err := os.Lstat(path); err != nil || !os.SameFile(before, now) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sockets: remove stale socket %s: %w", path, err)
	}
	return nil
}

// Listener accepts shared-memory connections, and TCP ones for a "tcp"
// network. It is safe for concurrent use.
type Listener struct {
	cfg   Config
	netw  string
	addr  net.Addr
	dev   *device
	nl    *nic.Listener
	tl    net.Listener
	conns chan net.Conn // accepted and set up, waiting for Accept
	done  chan struct{} // closed by Close
	once  sync.Once
	wg    sync.WaitGroup // accept loops and handshakes

	pmu     lockrank.Mutex            // guards pending
	pending map[*nic.Pending]struct{} // nic handshakes in progress; Close ends them
}

// Accept waits for the next connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: l.netw, Addr: l.addr, Err: net.ErrClosed}
	}
}

// Addr returns the listener's address: the TCP address for a "tcp"
// network.
func (l *Listener) Addr() net.Addr { return l.addr }

// Close stops listening; connections already accepted stay open.
func (l *Listener) Close() error {
	first := false
	l.once.Do(func() {
		first = true
		close(l.done)
		if l.nl != nil {
			l.nl.Close()
		}
		l.pmu.Lock()
		for p := range l.pending {
			p.Close()
		}
		l.pmu.Unlock()
		if l.tl != nil {
			l.tl.Close()
		}
	})
	if !first {
		return &net.OpError{Op: "close", Net: l.netw, Addr: l.addr, Err: net.ErrClosed}
	}
	l.wg.Wait()
	if l.dev != nil {
		l.dev.release()
	}
	return nil
}

func (l *Listener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// deliver hands c to Accept, or closes it when the listener closes.
func (l *Listener) deliver(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *Listener) acceptSHM() {
	defer l.wg.Done()
	for {
		p, err := l.nl.AcceptPending()
		if err != nil {
			if l.closed() || errors.Is(err, nic.ErrClosed) {
				return
			}
			// Out of descriptors or the like: do not spin.
			select {
			case <-l.done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		// Each handshake in its own goroutine: a peer that stays silent
		// holds up only its own connection, not the listener (it held
		// every other dialer for HandshakeTimeout).
		l.wg.Add(1)
		gopool.Go(func() {
			defer l.wg.Done()
			l.handshake(p)
		})
	}
}

// handshake sets up the connection p and hands it to Accept. A peer that
// fails the handshake is dropped (refused, with a reason, by the nic).
func (l *Listener) handshake(p *nic.Pending) {
	if h := testHookHandshake.Load(); h != nil {
		(*h)()
	}
	l.pmu.Lock()
	if l.closed() {
		l.pmu.Unlock()
		p.Close()
		return
	}
	if l.pending == nil {
		l.pending = map[*nic.Pending]struct{}{}
	}
	l.pending[p] = struct{}{}
	l.pmu.Unlock()
	d := l.dev
	cq := d.nic.NewCQ()
	var bell *nic.MemoryRegion // our hello's doorbell, readied by answerHello
	qp, err := p.Handshake(nic.QPOptions{SendCQ: cq, RecvCQ: cq, InPlace: true, Timeout: l.cfg.HandshakeTimeout,
		Answer: answerHello(d, &l.cfg, &bell)})
	l.pmu.Lock()
	delete(l.pending, p)
	l.pmu.Unlock()
	if err != nil {
		cq.Close()
		return
	}
	d.hold() // the connection's own
	laddr, raddr := l.shmAddrs(qp)
	// Both hellos came with the handshake: newConn waits for nothing.
	c, err := newConn(d, qp, cq, l.cfg, false, l.netw, laddr, raddr, bell, qp.PeerPrivateData())
	if err != nil {
		return
	}
	l.deliver(c)
}

func (l *Listener) shmAddrs(qp *nic.QueuePair) (laddr, raddr net.Addr) {
	if ta, ok := l.addr.(*net.TCPAddr); ok {
		ip := ta.IP
		if ip == nil || ip.IsUnspecified() {
			ip = net.IPv4(127, 0, 0, 1)
		}
		return ta, &net.TCPAddr{IP: ip}
	}
	return l.addr, &Addr{Net: l.netw, Name: fmt.Sprintf("pid:%d", qp.PeerPID())}
}

func (l *Listener) acceptTCP() {
	defer l.wg.Done()
	for {
		c, err := l.tl.Accept()
		if err != nil {
			if l.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-l.done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		l.deliver(c)
	}
}
