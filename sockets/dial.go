package sockets

import (
	"context"
	"fmt"
	"net"
	"time"

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
				laddr := &net.TCPAddr{IP: ta.IP}
				if ta.IP.IsUnspecified() {
					laddr.IP = net.IPv4(127, 0, 0, 1)
				}
				c, err := dialSHM(ctx, cfg, tcpName(ta.Port), network, laddr, ta)
				if err == nil {
					return c, nil
				}
				// No listener of ours there, or it failed: plain TCP.
			}
		}
		var nd net.Dialer
		return nd.DialContext(ctx, network, address)
	}
	return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w %q", ErrUnknownNetwork, network)}
}

func dialSHM(ctx context.Context, cfg Config, name, netw string, laddr, raddr net.Addr) (*Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		if t := time.Until(dl); t <= 0 {
			return nil, context.DeadlineExceeded
		} else if t < cfg.HandshakeTimeout {
			cfg.HandshakeTimeout = t
		}
	}
	d, err := acquireDevice(&cfg)
	if err != nil {
		return nil, err
	}
	cq := d.nic.NewCQ()
	qp, err := d.nic.Dial(name, nic.QPOptions{SendCQ: cq, RecvCQ: cq, InPlace: true, Timeout: cfg.HandshakeTimeout})
	if err != nil {
		d.release()
		return nil, err
	}
	return newConn(d, qp, cq, cfg, true, netw, laddr, raddr)
}
