package sockets

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/nic"
)

// Dialer connects to listeners. The zero value uses DefaultConfig.
type Dialer struct {
	// Config configures the connections; nil means DefaultConfig().
	Config *Config
}

// Dial connects to address on network with the default configuration:
// see Dialer.DialContext.
func Dial(network, address string) (net.Conn, error) {
	var d Dialer
	return d.DialContext(context.Background(), network, address)
}

// Dial is DialContext with a background context.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to address on network:
//
//   - "sandirect": address is a Unix socket path or an "@abstract" name
//     where a listener of ours listens; the connection is shared memory.
//   - "tcp", "tcp4", "tcp6": address is host:port. When host is on this
//     host (loopback, or an address of one of its interfaces) and
//     Config.ForceTCP is not set, a shared-memory connection to the
//     listener on that port is tried first; the dial falls back to plain
//     TCP when that fails. Other hosts get plain TCP.
//
// The returned connection is a *Conn, or a *net.TCPConn for TCP.
//
// A dial to a listener this process dialed before, with the same
// configuration, does not wait for the listener's answer: it takes it to
// be the one it gave last time (nic.QPOptions.Early), and the first Write
// goes out at once, as on a Unix socket whose listener has not accepted
// yet. If the listener answers otherwise — it refuses this time, or it
// is another device on the same name — the connection fails at its first
// use instead of at Dial, with a reset.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	cfg, err := resolve(d.Config)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	switch network {
	case "sandirect":
		c, err := dialSHM(ctx, cfg, address, network, &Addr{Net: network}, &Addr{Net: network, Name: address})
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Addr: &Addr{Net: network, Name: address}, Err: err}
		}
		return c, nil
	case "tcp", "tcp4", "tcp6":
		if !cfg.ForceTCP {
			if ta, ok := localTarget(ctx, network, address); ok {
				if c := dialLocalTCP(ctx, cfg, network, ta); c != nil {
					return c, nil
				}
			}
		}
		var nd net.Dialer
		return nd.DialContext(ctx, network, address)
	}
	return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w %q", ErrUnknownNetwork, network)}
}

// dialLocalTCP tries a shared-memory connection to the listener of ours
// on port ta.Port of this host, and returns nil when there is none or it
// fails: the caller dials plain TCP. A name found without a listener is
// remembered for noListenerTTL, so that a retry loop against a plain TCP
// service does not probe each time.
func dialLocalTCP(ctx context.Context, cfg Config, network string, ta *net.TCPAddr) *Conn {
	name := tcpName(ta.Port)
	if noListener.known(name) {
		return nil
	}
	laddr := &net.TCPAddr{IP: ta.IP}
	if ta.IP.IsUnspecified() {
		laddr.IP = net.IPv4(127, 0, 0, 1)
	}
	c, err := dialSHM(ctx, cfg, name, network, laddr, ta)
	if err != nil {
		if isNoListener(err) {
			noListener.add(name)
		}
		return nil
	}
	return c
}

func dialSHM(ctx context.Context, cfg Config, name, netw string, laddr, raddr net.Addr) (*Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		if t := time.Until(dl); t <= 0 {
			return nil, context.DeadlineExceeded
		} else if t < cfg.HandshakeTimeout {
			cfg.HandshakeTimeout = t
		}
	}
	// Connect before anything else exists: with nobody listening the dial
	// costs a socket and a refused connect, not a device.
	var ud net.Dialer
	uc, err := ud.DialContext(ctx, "unixpacket", name)
	if err != nil {
		return nil, fmt.Errorf("sockets: connect %s: %w", name, err)
	}
	d, err := acquireDevice(&cfg)
	if err != nil {
		uc.Close()
		return nil, err
	}
	bell, err := prepareHello(d)
	if err != nil {
		uc.Close()
		d.release()
		return nil, err
	}
	cq := d.nic.NewCQ()
	// Early: a listener that answered this hello before is taken to
	// answer the same, and the connection is usable before its reply.
	qp, err := d.nic.DialConn(uc.(*net.UnixConn), nic.QPOptions{SendCQ: cq, RecvCQ: cq, InPlace: true, Timeout: cfg.HandshakeTimeout,
		PrivateData: helloMsg(d, &cfg, true, uint32(cfg.Window), bell), Early: true})
	if err != nil {
		cq.Close()
		d.release()
		return nil, err
	}
	return newConn(d, qp, cq, cfg, true, netw, laddr, raddr, bell, qp.PeerPrivateData())
}

// isNoListener tells whether a connect failed because nothing listens on
// the name: it does not exist, or nobody accepts on it.
func isNoListener(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// noListenerTTL is how long a name found without a listener is believed
// to stay so: a listener that starts within it gets plain TCP dials
// meanwhile, which it accepts too.
const noListenerTTL = time.Second

// noListener remembers names found without a listener.
var noListener = negativeCache{ttl: noListenerTTL}

// negativeCache is a set of names with an expiry each. Safe for
// concurrent use.
type negativeCache struct {
	ttl time.Duration
	mu  lockrank.Mutex       // guards m
	m   map[string]time.Time // name → when the answer expires
}

func init() { noListener.mu.Init(lockrank.NegativeCache) }

// negativeCacheMax bounds the names remembered; past it the expired ones
// go, and if none has, all of them.
const negativeCacheMax = 4096

func (n *negativeCache) known(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	exp, ok := n.m[name]
	if ok && time.Now().After(exp) {
		delete(n.m, name)
		return false
	}
	return ok
}

func (n *negativeCache) add(name string) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[string]time.Time{}
	}
	if len(n.m) >= negativeCacheMax {
		for k, exp := range n.m {
			if now.After(exp) {
				delete(n.m, k)
			}
		}
		if len(n.m) >= negativeCacheMax {
			clear(n.m)
		}
	}
	n.m[name] = now.Add(n.ttl)
}

// forget drops name: a listener of ours now listens there.
func (n *negativeCache) forget(name string) {
	n.mu.Lock()
	delete(n.m, name)
	n.mu.Unlock()
}
