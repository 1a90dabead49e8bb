package sockets

import (
	"context"
	"fmt"
	"net"
	"strconv"
)

// Addr is the address of a shared-memory endpoint: a Unix socket path or
// an "@abstract" name of the connection manager.
type Addr struct {
	Net  string // "sandirect"
	Name string
}

// Network returns the address's network name.
func (a *Addr) Network() string { return a.Net }

func (a *Addr) String() string { return a.Name }

// tcpName is the connection manager's name for a TCP port of this host:
// a listener of network "tcp" listens there too.
func tcpName(port int) string { return fmt.Sprintf("@sandirect-tcp-%d", port) }

// localTarget resolves a "tcp" address and tells whether it is on this
// host: loopback, unspecified, or an address of one of its interfaces.
func localTarget(ctx context.Context, network, address string) (*net.TCPAddr, bool) {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, false
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return nil, false
	}
	var ips []net.IP
	if host == "" {
		ips = []net.IP{net.IPv4(127, 0, 0, 1)}
	} else if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else {
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		if err != nil {
			return nil, false
		}
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	for _, ip := range ips {
		switch network {
		case "tcp4":
			if ip.To4() == nil {
				continue
			}
		case "tcp6":
			if ip.To4() != nil {
				continue
			}
		}
		if ip.IsLoopback() || ip.IsUnspecified() || isOwnIP(ip) {
			return &net.TCPAddr{IP: ip, Port: port}, true
		}
	}
	return nil, false
}

// isOwnIP tells whether ip belongs to an interface of this host.
func isOwnIP(ip net.IP) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}
