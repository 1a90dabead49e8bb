package sockets

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/sandirect/sandirect/shm"
)

// makePipe returns a nettest.MakePipe over listeners and dialers of ours.
func makePipe(t *testing.T, network string, dialCfg, listenCfg *Config) nettest.MakePipe {
	return func() (c1, c2 net.Conn, stop func(), err error) {
		addr := testAddr()
		if network != "sandirect" {
			addr = "127.0.0.1:0"
		}
		lc := ListenConfig{Config: listenCfg}
		ln, err := lc.Listen(t.Context(), network, addr)
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		ch := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			ch <- c
		}()
		d := Dialer{Config: dialCfg}
		c1, err = d.Dial(network, ln.Addr().String())
		if err != nil {
			return nil, nil, nil, err
		}
		select {
		case c2 = <-ch:
		case <-time.After(10 * time.Second):
		}
		if c2 == nil {
			c1.Close()
			return nil, nil, nil, net.ErrClosed
		}
		stop = func() {
			c1.Close()
			c2.Close()
			waitTorn(t, c1)
			waitTorn(t, c2)
		}
		return c1, c2, stop, nil
	}
}

func TestNettest(t *testing.T) {
	busy := &Config{Wait: shm.WaitConfig{Mode: shm.WaitBusyPoll}}
	block := &Config{Wait: shm.WaitConfig{Mode: shm.WaitBlock}}
	noRead := &Config{NoRDMARead: true}
	tcp := &Config{ForceTCP: true}
	for _, tc := range []struct {
		name             string
		network          string
		dialCfg, lstnCfg *Config
		wantTCP          bool
	}{
		{"shm/adaptive", "sandirect", nil, nil, false},
		{"shm/busy", "sandirect", busy, busy, false},
		{"shm/block", "sandirect", block, block, false},
		{"shm/noread", "sandirect", noRead, noRead, false},
		{"tcp/shm", "tcp", nil, nil, false},
		{"tcp/plain", "tcp", tcp, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // the tests mostly sleep
			mp := makePipe(t, tc.network, tc.dialCfg, tc.lstnCfg)
			c1, c2, stop, err := mp()
			if err != nil {
				t.Fatal(err)
			}
			_, isTCP := c1.(*net.TCPConn)
			_, isTCP2 := c2.(*net.TCPConn)
			stop()
			if isTCP != tc.wantTCP || isTCP2 != tc.wantTCP {
				t.Fatalf("got %T and %T", c1, c2)
			}
			nettest.TestConn(t, mp)
		})
	}
}
