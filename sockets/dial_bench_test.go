package sockets

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/pin"
)

func init() {
	testutil.RegisterChild("echo-listeners", echoListenersChild)
}

// envChildProfile names a file for the echo-listeners child's CPU
// profile: the other half of a dial's work, which -cpuprofile misses.
const envChildProfile = "SANDIRECT_BENCH_CHILD_CPUPROFILE"

// echoListenersChild listens with this package on args[0], on the Unix
// stream socket args[1] and on TCP loopback, echoes every connection
// until its peer closes it, writes the TCP address to fd 3 once all
// listen, and serves until fd 3's reader closes its end of fd 4.
func echoListenersChild(args []string) error {
	if path := os.Getenv(envChildProfile); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, l := range []struct{ netw, addr string }{{"sandirect", args[0]}, {"unix", args[1]}, {"tcp", "127.0.0.1:0"}} {
		listen := net.Listen
		if l.netw == "sandirect" {
			listen = Listen
		}
		ln, err := listen(l.netw, l.addr)
		if err != nil {
			return err
		}
		ls = append(ls, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					io.Copy(c, c)
					c.Close()
				}()
			}
		}()
	}
	ready := os.NewFile(3, "ready")
	fmt.Fprintln(ready, ls[2].Addr())
	ready.Close()
	stop := os.NewFile(4, "stop")
	io.Copy(io.Discard, stop) // EOF: the benchmark is done
	return nil
}

// startEchoListeners runs echoListenersChild and returns its addresses
// for "sandirect", "unix" and "tcp", and the function that stops it.
func startEchoListeners(tb testing.TB) (addrs map[string]string, stop func()) {
	tb.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	shmAddr := fmt.Sprintf("@sandirect-bench-dial-%d", os.Getpid())
	unixAddr := shmAddr + "-unix"
	child := testutil.StartChild(tb, "echo-listeners", []*os.File{w, sr}, shmAddr, unixAddr)
	w.Close()
	sr.Close()
	r.SetReadDeadline(time.Now().Add(20 * time.Second))
	line, err := bufio.NewReader(r).ReadString('\n')
	r.Close()
	if err != nil {
		tb.Fatalf("echo listeners not ready: %v; output:\n%s", err, child.Output())
	}
	addrs = map[string]string{"shm": shmAddr, "unix": unixAddr, "tcp": strings.TrimSpace(line)}
	return addrs, func() {
		sw.Close()
		if err := child.Wait(20 * time.Second); err != nil {
			tb.Errorf("echo listeners: %v; output:\n%s", err, child.Output())
		}
	}
}

// BenchmarkDial: a connection per request — dial, write 64 bytes, read
// the echo, close — to a listener in another process, against a Unix
// stream socket and TCP loopback. (The setup suite of the bench command
// measures the same with percentiles.)
func BenchmarkDial(b *testing.B) {
	addrs, stop := startEchoListeners(b)
	defer stop()
	// Steady dials: the first dial starts the eBPF monitor's load in the
	// background (as root), and the dials that overlap it and the
	// collection after it are slower (docs/setup.md, "Dials while the
	// monitor loads"): the monitor is waited for and a warm-up's dials
	// made first. The first dial has a benchmark of its own
	// (BenchmarkDialFreshDevice) and a row in the bench's setup suite.
	c, err := Dial("sandirect", addrs["shm"])
	if err != nil {
		b.Fatal(err)
	}
	waitMonitor(c)
	c.Close()
	buf := make([]byte, 64)
	for range 1000 {
		dialEchoClose(b, Dial, "sandirect", addrs["shm"], buf)
	}
	for _, tr := range []struct{ name, netw string }{{"shm", "sandirect"}, {"unix", "unix"}, {"tcp", "tcp"}} {
		dial := net.Dial
		if tr.netw == "sandirect" {
			dial = Dial
		}
		b.Run("transport="+tr.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dialEchoClose(b, dial, tr.netw, addrs[tr.name], buf)
			}
		})
	}
}

// BenchmarkDialFreshDevice: BenchmarkDial's connection per request for a
// program whose device closed since its last connection (deviceLinger
// passed): each dial opens the process's device again. With the idle
// eBPF monitor kept (pin.SetIdleMonitorLinger, the library's default),
// and with none, as every device before 2026-12-07 loaded its own.
func BenchmarkDialFreshDevice(b *testing.B) {
	addrs, stop := startEchoListeners(b)
	defer stop()
	for _, bc := range []struct {
		name   string
		linger time.Duration
	}{{"idle-monitor", pin.DefaultIdleMonitorLinger}, {"no-idle-monitor", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			defer pin.SetIdleMonitorLinger(pin.SetIdleMonitorLinger(bc.linger))
			buf := make([]byte, 64)
			for b.Loop() {
				// A device's close runs in the background in a program
				// (its linger's timer); with no idle monitor it detaches
				// the probes there, hundreds of ms of grace periods.
				b.StopTimer()
				closeIdleDevices()
				b.StartTimer()
				waitTorn(b, dialEchoClose(b, Dial, "sandirect", addrs["shm"], buf))
			}
		})
	}
}

// dialEchoClose dials addr on netw with dial, writes buf, reads its echo
// into it and closes the connection, which it returns.
func dialEchoClose(b *testing.B, dial func(string, string) (net.Conn, error), netw, addr string, buf []byte) net.Conn {
	c, err := dial(netw, addr)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Write(buf); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		b.Fatal(err)
	}
	if err := c.Close(); err != nil {
		b.Fatal(err)
	}
	return c
}
