package sockets

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/shm"
)

// benchConfigs are the transports of the benchmarks, by name.
var benchConfigs = map[string]*Config{
	"busy":     {Wait: shm.WaitConfig{Mode: shm.WaitBusyPoll}},
	"block":    {Wait: shm.WaitConfig{Mode: shm.WaitBlock}},
	"sleep":    {Wait: shm.WaitConfig{Mode: shm.WaitBlock}, ReplyWait: -1},
	"adaptive": nil,
	"copy":     {ZeroCopy: ZeroCopyNever, CopyChunk: 4 << 20, MaxCopyInFlight: 16 << 20},
	"zerocopy": {ZeroCopy: ZeroCopyAlways},
}

// The benchmark server child: args network | address | config | mode.
// It accepts connections one after the other. echo: echoes each until EOF.
// sink: reads until EOF touching every byte, then writes one byte.
func init() {
	testutil.RegisterChild("bench-server", func(args []string) error {
		network, addr, cfgName, mode := args[0], args[1], args[2], args[3]
		var ln net.Listener
		var err error
		if network == "sandirect" || cfgName != "" {
			lc := ListenConfig{Config: benchConfigs[cfgName]}
			ln, err = lc.Listen(context.Background(), network, addr)
		} else {
			ln, err = net.Listen(network, addr)
		}
		if err != nil {
			return err
		}
		fmt.Println(ln.Addr())
		buf := make([]byte, 16<<20)
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			if mode == "duplex" {
				duplexServe(c)
			} else if mode == "echo" {
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, err := c.Write(buf[:n]); err != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
			} else {
				var sum byte
				for {
					n, err := c.Read(buf)
					// Touch every byte (vectorized).
					sum += byte(bytes.Count(buf[:n], []byte{0}))
					if err != nil {
						if err != io.EOF {
							fmt.Fprintln(os.Stderr, "sink:", err)
						}
						break
					}
				}
				c.Write([]byte{sum | 1})
			}
			c.Close()
		}
	})
}

// benchServer starts a server child and returns a dial function.
func benchServer(b *testing.B, transport, mode string) func() net.Conn {
	b.Helper()
	var network, addr, cfgName string
	switch transport {
	case "unix":
		network, addr = "unix", filepath.Join(b.TempDir(), "s")
	case "tcp":
		network, addr = "tcp", "127.0.0.1:0"
	default:
		network, addr, cfgName = "sandirect", testAddr(), transport
	}
	child := testutil.StartChild(b, "bench-server", nil, network, addr, cfgName, mode)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := child.Output()
		if i := len(out); i > 0 && out[i-1] == '\n' {
			addr = out[:i-1]
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("server did not start: %s", out)
		}
		select {
		case <-child.Done():
			b.Fatalf("server exited: %s", child.Output())
		case <-time.After(time.Millisecond):
		}
	}
	return func() net.Conn {
		var c net.Conn
		var err error
		if cfgName != "" || network == "sandirect" {
			d := Dialer{Config: benchConfigs[cfgName]}
			c, err = d.Dial(network, addr)
		} else {
			c, err = net.Dial(network, addr)
		}
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

var benchTransports = []string{"busy", "block", "adaptive", "unix", "tcp"}

// BenchmarkPingPong measures a round trip of size bytes to another
// process and back; half of it is the one-way latency.
func BenchmarkPingPong(b *testing.B) {
	for _, tr := range benchTransports {
		for _, size := range []int{8, 64, 4096, 64 << 10} {
			b.Run(fmt.Sprintf("transport=%s/size=%s", tr, sizeName(size)), func(b *testing.B) {
				pingPong(b, tr, size)
			})
		}
	}
}

// pingPong is pingPongOver a connection to an echo server over tr.
func pingPong(b *testing.B, tr string, size int) {
	c := benchServer(b, tr, "echo")()
	defer c.Close()
	b.SetBytes(int64(2 * size))
	pingPongOver(b, c, size)
}

// pingPongOver writes size bytes to c, an echo's, and reads them back, b.N
// times; it reports half the round trip.
func pingPongOver(b *testing.B, c net.Conn, size int) {
	buf := make([]byte, size)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/half-rtt")
}

// BenchmarkStream measures one-way streaming of size-byte writes to
// another process that reads and touches every byte.
func BenchmarkStream(b *testing.B) {
	for _, tr := range append(benchTransports, "copy", "zerocopy") {
		for _, size := range []int{64 << 10, 1 << 20, 4 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("transport=%s/size=%s", tr, sizeName(size)), func(b *testing.B) {
				dial := benchServer(b, tr, "sink")
				c := dial()
				defer c.Close()
				buf := make([]byte, size)
				for i := range buf {
					buf[i] = byte(i)
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				c.(interface{ CloseWrite() error }).CloseWrite()
				if _, err := io.ReadFull(c, buf[:1]); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if sc, ok := c.(*Conn); ok && os.Getenv("SOCKETS_BENCH_STATS") != "" {
					b.Logf("%+v", sc.Stats())
				}
			})
		}
	}
}

// BenchmarkPingPongInProcess is PingPong with both ends in this process:
// the software path without a second process's scheduling.
func BenchmarkPingPongInProcess(b *testing.B) {
	for _, tr := range []string{"busy", "block"} {
		b.Run("transport="+tr+"/size=64B", func(b *testing.B) {
			c, s := pipe(b, benchConfigs[tr], benchConfigs[tr])
			go io.Copy(s, s)
			pingPongOver(b, c, 64)
		})
	}
}

// BenchmarkPingPongThreads is a 64-byte ping-pong between two locked
// threads of this process over a busy-polling Conn: the connection's
// round trip without a second process, for comparison with the same loop
// one and two layers down (nic BenchmarkInPlacePingPong, shm
// BenchmarkRingPingPongThreads). Reported per one-way trip.
func BenchmarkPingPongThreads(b *testing.B) {
	c, s := pipe(b, benchConfigs["busy"], benchConfigs["busy"])
	const stop = 2 // first byte of the last message
	buf, echo := make([]byte, 64), make([]byte, 64)
	testutil.PingPongThreads(b,
		func() error {
			if _, err := c.Write(buf); err != nil {
				return err
			}
			_, err := io.ReadFull(c, buf)
			return err
		},
		func() (bool, error) {
			if _, err := io.ReadFull(s, echo); err != nil || echo[0] == stop {
				return true, err
			}
			_, err := s.Write(echo)
			return false, err
		},
		func() error {
			buf[0] = stop
			_, err := c.Write(buf)
			return err
		})
}

// BenchmarkSoftwarePath is a round trip of 64 bytes driven by one
// goroutine, both ends in this process: nothing waits, so it measures
// the software cost of two writes and two reads.
func BenchmarkSoftwarePath(b *testing.B) {
	c, s := pipe(b, benchConfigs["busy"], benchConfigs["busy"])
	buf := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		c.Write(buf)
		io.ReadFull(s, buf)
		s.Write(buf)
		io.ReadFull(c, buf)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/one-way")
}

// BenchmarkStreamCPU streams size-byte writes between two goroutines of
// this process, each on its own thread, waiting by blocking (a waiting
// side uses no CPU), and reports each side's CPU time per byte besides
// the wall-clock rate: "bound-GB/s" is the rate the busier side allows,
// which other work on the machine hardly disturbs. The transports are
// the source choices (copy in 960 KiB pieces; zero copy, the reader's
// cross-process read of all of it; split transfers, the default for
// reused buffers from 2 MiB, both sides copying half) and a Unix socket
// pair.
func BenchmarkStreamCPU(b *testing.B) {
	blk := shm.WaitConfig{Mode: shm.WaitBlock}
	for _, size := range []int{256 << 10, 1 << 20, 4 << 20, 16 << 20} {
		for _, tr := range []struct {
			name string
			cfg  *Config
		}{
			{"copy", &Config{Wait: blk, ZeroCopy: ZeroCopyNever}},
			{"zerocopy", &Config{Wait: blk, ZeroCopy: ZeroCopyAlways, SplitMin: -1}},
			{"split", &Config{Wait: blk}}, // the default: split from 2 MiB, buffers reused

			{"unix", nil},
		} {
			b.Run(fmt.Sprintf("transport=%s/size=%s", tr.name, sizeName(size)), func(b *testing.B) {
				var c, s net.Conn
				if tr.cfg == nil {
					c, s = unixPair(b)
				} else {
					c, s = pipe(b, tr.cfg, tr.cfg)
				}
				n := b.N
				rcpu := make(chan time.Duration, 1)
				go func() {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					buf := make([]byte, size)
					t0, _ := sys.ThreadCPU()
					for range n {
						if _, err := io.ReadFull(s, buf); err != nil {
							break
						}
					}
					t1, _ := sys.ThreadCPU()
					rcpu <- t1 - t0
				}()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				t0, _ := sys.ThreadCPU()
				for range n {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				t1, _ := sys.ThreadCPU()
				r := <-rcpu
				b.StopTimer()
				bytes := float64(size) * float64(n)
				w := t1 - t0
				b.ReportMetric(bytes/w.Seconds()/1e9, "writer-GB/s-cpu")
				b.ReportMetric(bytes/r.Seconds()/1e9, "reader-GB/s-cpu")
				b.ReportMetric(bytes/max(w, r).Seconds()/1e9, "bound-GB/s")
			})
		}
	}
}

// unixPair connects two Unix stream sockets of this process.
func unixPair(b testing.TB) (net.Conn, net.Conn) {
	ln, err := net.Listen("unix", fmt.Sprintf("@sockets-bench-%d-%d", os.Getpid(), addrSeq.Add(1)))
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		s, _ := ln.Accept()
		ch <- s
	}()
	c, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s := <-ch
	if s == nil {
		b.Fatal("accept failed")
	}
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// BenchmarkDuplex streams size-byte writes between two connected ends in
// this process, one way (client to server) or both ways at
// once, each end's Writes and Reads from goroutines of their own, over the
// default Config and over a Unix socket pair: what a direction loses when
// the other runs beside it. The metric is the bytes moved per second, all
// directions together ("SetBytes": one op moves size bytes each way that
// runs).
func BenchmarkDuplex(b *testing.B) {
	for _, tr := range []string{"default", "unix"} {
		for _, size := range []int{4 << 10, 64 << 10} {
			for _, both := range []bool{false, true} {
				mode := "oneway"
				if both {
					mode = "both"
				}
				b.Run(fmt.Sprintf("transport=%s/size=%s/%s", tr, sizeName(size), mode), func(b *testing.B) {
					var c, s net.Conn
					if tr == "unix" {
						c, s = unixPair(b)
					} else {
						c, s = pipe(b, nil, nil)
					}
					dirs := [][2]net.Conn{{c, s}}
					if both {
						dirs = append(dirs, [2]net.Conn{s, c})
					}
					b.SetBytes(int64(size * len(dirs)))
					b.ReportAllocs()
					n := b.N
					errs := make(chan error, 2*len(dirs))
					for _, d := range dirs {
						w, r := d[0], d[1]
						go func() {
							buf := make([]byte, size)
							for range n {
								if _, err := w.Write(buf); err != nil {
									errs <- err
									return
								}
							}
							errs <- nil
						}()
						go func() {
							buf := make([]byte, size)
							var err error
							for i := 0; i < n && err == nil; i++ {
								_, err = io.ReadFull(r, buf)
							}
							errs <- err
						}()
					}
					for range 2 * len(dirs) {
						if err := <-errs; err != nil {
							b.Fatal(err)
						}
					}
					if sc, ok := c.(*Conn); ok && os.Getenv("SOCKETS_BENCH_STATS") != "" {
						b.Logf("%+v", sc.Stats())
					}
				})
			}
		}
	}
}

// duplexServe is the duplex server's side of a connection: it reads the
// size of the writes and how many each side makes, then streams both
// ways (duplexOver).
func duplexServe(c net.Conn) {
	var hdr [16]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	duplexOver(c, int(binary.LittleEndian.Uint64(hdr[:8])), int(binary.LittleEndian.Uint64(hdr[8:])))
}

// duplexOver makes count writes of size bytes to c from a goroutine of
// its own while it reads as many, and returns the first error of either.
func duplexOver(c net.Conn, size, count int) error {
	werr := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range count {
			if _, err := c.Write(buf); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	buf := make([]byte, size)
	for range count {
		if _, err := io.ReadFull(c, buf); err != nil {
			return err // the writer ends when c is closed
		}
	}
	return <-werr
}

// BenchmarkDuplexProcesses streams size-byte writes both ways at once
// between two processes, each side's Writes and Reads in goroutines of
// their own, as gRPC's and HTTP/2's connections run: what the two
// directions of a connection cost each other (Conn.mu, the CPUs).
// SetBytes counts both directions.
func BenchmarkDuplexProcesses(b *testing.B) {
	for _, tr := range []string{"adaptive", "busy", "unix"} {
		for _, size := range []int{4 << 10, 64 << 10} {
			b.Run(fmt.Sprintf("transport=%s/size=%s", tr, sizeName(size)), func(b *testing.B) {
				c := benchServer(b, tr, "duplex")()
				defer c.Close()
				var hdr [16]byte
				binary.LittleEndian.PutUint64(hdr[:8], uint64(size))
				binary.LittleEndian.PutUint64(hdr[8:], uint64(b.N))
				b.SetBytes(int64(2 * size))
				b.ReportAllocs()
				b.ResetTimer()
				if _, err := c.Write(hdr[:]); err != nil {
					b.Fatal(err)
				}
				if err := duplexOver(c, size, b.N); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
