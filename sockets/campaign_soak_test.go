package sockets

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// The soak: many connections to an echo process, in both RDMA-Read modes,
// every source choice, random sizes through every path (eager, copied and
// zero-copy rendezvous, pipelined copies; direct and staged receives on
// both sides), every byte compared with what was sent and the whole stream
// checksummed (CRC-32C) at both ends. Throughput and p99 latency (from
// the start of a write to the last byte of its echo) are logged per
// interval.
//
// SANDIRECT_SOAK_BYTES sets the bytes sent (each echoed back), e.g. 10G;
// by default a short run of 200M (100M under the race detector: with 50M,
// 15 messages a mode, a loaded machine's timing left the staged receive
// path untaken now and then, and the path check failed).

const envSoakBytes = "SANDIRECT_SOAK_BYTES"

// soakBytes returns the bytes to send, from the environment.
func soakBytes(t *testing.T) int64 {
	s := os.Getenv(envSoakBytes)
	if s == "" {
		return int64(max(scaled(200<<20), 100<<20))
	}
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive count with an optional M or G", envSoakBytes, os.Getenv(envSoakBytes))
	}
	return n * mult
}

// soakModes are the two RDMA-Read settings: read rendezvous (the default)
// and write rendezvous (the receivers do not RDMA Read).
var soakModes = map[string]Config{"read": {}, "write": {NoRDMARead: true}}

// soakPattern is the stream's content: byte i of a stream is
// soakPattern[i % len]. Its length is no power of two, so that a lost or
// repeated chunk of a power-of-two size shows.
var soakPattern = sync.OnceValue(func() []byte { return randBytes(32<<20 + 4099) })

// soakSize picks a message size from a class that takes each path.
func soakSize(r *rand.Rand) int {
	switch r.IntN(4) {
	case 0:
		return 1 + r.IntN(16<<10) // eager
	case 1:
		return 16<<10 + 1 + r.IntN(240<<10) // rendezvous, copied when auto
	case 2:
		return 256<<10 + r.IntN(4<<20-256<<10) // rendezvous, zero copy when auto
	}
	return 4<<20 + 1 + r.IntN(4<<20) // pipelined copies when auto
}

// soakReadSize picks a read size: small ones take rendezvous data
// through the staging buffer, large ones directly.
func soakReadSize(r *rand.Rand, max int) int {
	if r.IntN(2) == 0 {
		return 1 + r.IntN(64<<10)
	}
	return 1 + r.IntN(max)
}

// The echo child: listens on args[0] in mode args[1], accepts args[2]
// connections and echoes each until EOF, reading with random sizes.
func init() {
	testutil.RegisterChild("soak-echo", func(args []string) error {
		n, _ := strconv.Atoi(args[2])
		cfg := soakModes[args[1]]
		lc := ListenConfig{Config: &cfg}
		ln, err := lc.Listen(context.Background(), "sandirect", args[0])
		if err != nil {
			return err
		}
		say("listening")
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := rand.New(rand.NewPCG(uint64(i), 5))
				buf := make([]byte, 8<<20)
				for {
					k, err := c.Read(buf[:soakReadSize(r, len(buf))])
					if k > 0 {
						if _, werr := c.Write(buf[:k]); werr != nil {
							errs <- fmt.Errorf("conn %d: echo: %w", i, werr)
							return
						}
					}
					if err == io.EOF {
						c.(*Conn).CloseWrite()
						return
					}
					if err != nil {
						errs <- fmt.Errorf("conn %d: %w", i, err)
						return
					}
				}
			}()
		}
		ln.Close()
		wg.Wait()
		close(errs)
		for err := range errs {
			return err
		}
		return Flush(context.Background())
	})
}

// soakMeter collects what the reporter logs.
type soakMeter struct {
	bytes   atomic.Int64 // echoed bytes received and checked
	mu      sync.Mutex   // guards lat
	lat     []time.Duration
	corrupt atomic.Int64
}

func (m *soakMeter) latency(d time.Duration) {
	m.mu.Lock()
	m.lat = append(m.lat, d)
	m.mu.Unlock()
}

// report logs one interval: throughput of checked echo bytes, and the
// latency quantiles of the messages whose echo completed in it.
func (m *soakMeter) report(t *testing.T, mode string, start time.Time, dt time.Duration, prev int64) int64 {
	now := m.bytes.Load()
	m.mu.Lock()
	lat := m.lat
	m.lat = nil
	m.mu.Unlock()
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	t.Logf("soak %s t=%5.1fs: %7.1f MB/s echoed (%.2f GB so far), %4d messages, latency p50 %v p99 %v max %v",
		mode, time.Since(start).Seconds(), float64(now-prev)/dt.Seconds()/1e6, float64(now)/1e9, len(lat),
		q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond), q(1).Round(time.Microsecond))
	return now
}

func TestCampaignSoak(t *testing.T) {
	total := soakBytes(t)
	const conns = 6 // per mode: two of each source choice
	interval := time.Second
	if total > 1<<30 {
		interval = 2 * time.Second
	}
	for _, mode := range []string{"read", "write"} {
		t.Run(mode, func(t *testing.T) {
			perConn := total / 2 / conns
			addr := testAddr()
			child, n := startNoted(t, "soak-echo", addr, mode, strconv.Itoa(conns))
			defer n.close()
			n.wait(t, "listening")
			var m soakMeter
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, conns)
			stats := make([]*Conn, conns)
			for i := range conns {
				cfg := soakModes[mode]
				cfg.ZeroCopy = []ZeroCopy{ZeroCopyAuto, ZeroCopyAlways, ZeroCopyNever}[i%3]
				d := Dialer{Config: &cfg}
				c, err := d.Dial("sandirect", addr)
				if err != nil {
					t.Fatalf("dial %d: %v\n%s", i, err, child.Output())
				}
				defer c.Close()
				stats[i] = c.(*Conn)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := soakConn(c, uint64(i), perConn, &m); err != nil {
						errs <- fmt.Errorf("conn %d (%v): %w", i, cfg.ZeroCopy, err)
						c.Close()
					}
				}()
			}
			finished := make(chan struct{})
			go func() { wg.Wait(); close(finished) }()
			tick := time.NewTicker(interval)
			prev, last := int64(0), start
			// No deadlines on the connections (a Read with one never
			// takes the write rendezvous directly): a watchdog instead,
			// which fails the test when nothing moves for a minute.
			stalled, lastBytes := time.Now(), int64(-1)
		loop:
			for {
				select {
				case <-finished:
					break loop
				case now := <-tick.C:
					prev = m.report(t, mode, start, now.Sub(last), prev)
					last = now
					if b := m.bytes.Load(); b != lastBytes {
						stalled, lastBytes = now, b
					} else if now.Sub(stalled) > time.Minute {
						for i, c := range stats {
							t.Errorf("stalled: conn %d: %s", i, c.debugState())
							c.Close()
						}
						<-finished
						break loop
					}
				}
			}
			tick.Stop()
			m.report(t, mode, start, time.Since(last), prev)
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			el := time.Since(start)
			t.Logf("soak %s: %.2f GB sent and echoed back over %d connections in %v: %.1f MB/s each way; corrupt reads %d",
				mode, float64(m.bytes.Load())/1e9, conns, el.Round(time.Millisecond), float64(m.bytes.Load())/el.Seconds()/1e6, m.corrupt.Load())
			if m.corrupt.Load() != 0 || m.bytes.Load() != perConn*conns {
				t.Fatalf("%d corrupt reads, %d bytes echoed of %d", m.corrupt.Load(), m.bytes.Load(), perConn*conns)
			}
			// Every path was taken.
			var sum Counters
			for _, c := range stats {
				s := c.Stats()
				sum.BytesEager += s.BytesEager
				sum.BytesInline += s.BytesInline
				sum.BytesReadRendezvous += s.BytesReadRendezvous
				sum.BytesWriteRendezvous += s.BytesWriteRendezvous
				sum.BytesZeroCopy += s.BytesZeroCopy
				sum.BytesCopied += s.BytesCopied
				sum.BytesDirect += s.BytesDirect
				sum.BytesStaged += s.BytesStaged
			}
			t.Logf("paths (this side): eager %d inline %d read-rdv %d write-rdv %d zero-copy %d copied %d direct %d staged %d",
				sum.BytesEager, sum.BytesInline, sum.BytesReadRendezvous, sum.BytesWriteRendezvous, sum.BytesZeroCopy, sum.BytesCopied, sum.BytesDirect, sum.BytesStaged)
			rdv := sum.BytesReadRendezvous
			if mode == "write" {
				rdv = sum.BytesWriteRendezvous
			}
			if sum.BytesEager == 0 || sum.BytesInline == 0 || rdv == 0 || sum.BytesZeroCopy == 0 || sum.BytesCopied == 0 || sum.BytesDirect == 0 || sum.BytesStaged == 0 {
				t.Errorf("a path was not taken")
			}
			for _, c := range stats {
				c.Close()
			}
			if err := child.Wait(time.Minute); err != nil {
				t.Fatal(err)
			}
			for _, c := range stats {
				waitTorn(t, c)
			}
		})
	}
}

// soakConn sends total bytes of the pattern on c from a seeded position in
// random-sized writes and checks the echo, byte by byte and by CRC-32C.
func soakConn(c net.Conn, seed uint64, total int64, m *soakMeter) error {
	pat := soakPattern()
	origin := int64(seed) * 1000003 // where this stream starts in the pattern
	at := func(off int64, n int) []byte {
		// n bytes of the stream from off (at most one wrap).
		p := (origin + off) % int64(len(pat))
		if int(p)+n <= len(pat) {
			return pat[p : int(p)+n]
		}
		return append(slices.Clone(pat[p:]), pat[:n-(len(pat)-int(p))]...)
	}
	type sent struct {
		end   int64
		start time.Time
	}
	ends := make(chan sent, 1024)
	tab := crc32.MakeTable(crc32.Castagnoli)
	var sentCRC uint32
	werr := make(chan error, 1)
	go func() {
		r := rand.New(rand.NewPCG(seed, 7))
		buf := make([]byte, 8<<20+1)
		defer close(ends)
		for off := int64(0); off < total; {
			n := int(min(int64(soakSize(r)), total-off))
			b := buf[:n]
			copy(b, at(off, n))
			sentCRC = crc32.Update(sentCRC, tab, b)
			ends <- sent{off + int64(n), time.Now()}
			if _, err := c.Write(b); err != nil {
				werr <- fmt.Errorf("write at %d: %w", off, err)
				return
			}
			// Reuse the buffer at once: a copied write must have copied,
			// a zero-copy one must be done with it.
			for i := range b {
				b[i] = 0xEE
			}
			off += int64(n)
		}
		werr <- c.(*Conn).CloseWrite()
	}()
	r := rand.New(rand.NewPCG(seed, 8))
	buf := make([]byte, 8<<20)
	var got int64
	var crc uint32
	var pending []sent
	for {
		k, err := c.Read(buf[:soakReadSize(r, len(buf))])
		if k > 0 {
			if !bytes.Equal(buf[:k], at(got, k)) {
				m.corrupt.Add(1)
				return fmt.Errorf("echo differs in [%d, %d)", got, got+int64(k))
			}
			crc = crc32.Update(crc, tab, buf[:k])
			got += int64(k)
			m.bytes.Add(int64(k))
			now := time.Now()
			for {
				if len(pending) == 0 {
					select {
					case s, ok := <-ends:
						if ok {
							pending = append(pending, s)
						}
					default:
					}
				}
				if len(pending) == 0 || pending[0].end > got {
					break
				}
				m.latency(now.Sub(pending[0].start))
				pending = pending[1:]
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read at %d: %w", got, err)
		}
	}
	if err := <-werr; err != nil {
		return err
	}
	if got != total || crc != sentCRC {
		return fmt.Errorf("echoed %d bytes of %d, CRC-32C %08x, sent %08x", got, total, crc, sentCRC)
	}
	return nil
}

// TestCampaignEchoInProcess echoes a soak stream between two connections
// of this process in both modes: both sides write and read at once. It
// caught a lost wake-up: a cts dispatched by the reading goroutine while
// the writing one was between its check and its wait hung the write
// rendezvous for good.
func TestCampaignEchoInProcess(t *testing.T) {
	for _, mode := range []string{"read", "write"} {
		for _, zc := range []ZeroCopy{ZeroCopyAuto, ZeroCopyAlways, ZeroCopyNever} {
			t.Run(mode+"/"+zc.String(), func(t *testing.T) {
				cfg := soakModes[mode]
				wcfg := cfg
				wcfg.ZeroCopy = zc
				c, s := pipe(t, &wcfg, &cfg)
				go func() {
					r := rand.New(rand.NewPCG(1, 5))
					buf := make([]byte, 8<<20)
					for {
						k, err := s.Read(buf[:soakReadSize(r, len(buf))])
						if k > 0 {
							if _, err := s.Write(buf[:k]); err != nil {
								return
							}
						}
						if err != nil {
							s.(*Conn).CloseWrite()
							return
						}
					}
				}()
				var m soakMeter
				done := make(chan error, 1)
				go func() { done <- soakConn(c, 3, int64(scaled(64<<20)), &m) }()
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(60 * time.Second):
					t.Logf("client: %s", c.(*Conn).debugState())
					t.Logf("server: %s", s.(*Conn).debugState())
					c.Close()
					s.Close()
					t.Fatalf("stuck after %d bytes", m.bytes.Load())
				}
			})
		}
	}
}
