package sockets

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
)

// smallConfig has small thresholds, so that tests cross all of them with
// little data.
func smallConfig() Config {
	return Config{
		BufferSize:      512,
		Window:          6,
		SendBuffers:     3,
		EagerThreshold:  2048,
		MaxTransfer:     256 << 10,
		CopyThreshold:   32 << 10,
		ZeroCopyMax:     128 << 10,
		CopyChunk:       64 << 10,
		MaxCopyInFlight: 192 << 10,
		StagingSize:     16 << 10,
		DirectRead:      8 << 10,
	}
}

// sizesAround returns sizes at and around every threshold of cfg.
func sizesAround(cfg Config) []int {
	c := cfg.withDefaults()
	pay := c.BufferSize - headerSize
	var s []int
	for _, t := range []int{1, pay, 2 * pay, c.EagerThreshold, pay + c.CopyChunk, pay + c.CopyThreshold, pay + c.MaxTransfer, c.StagingSize, c.DirectRead, 2*pay + c.MaxTransfer} {
		for _, d := range []int{-1, 0, 1} {
			if t+d > 0 {
				s = append(s, t+d)
			}
		}
	}
	return s
}

// pickSize returns a size at a threshold or a random one up to max.
func pickSize(r *rand.Rand, sizes []int, max int) int {
	if r.IntN(3) == 0 {
		return 1 + r.IntN(max)
	}
	return sizes[r.IntN(len(sizes))]
}

// writeStream writes total pseudo-random bytes (from seed) in writes of
// sizes around the thresholds and returns their hash.
func writeStream(w io.Writer, seed uint64, total int, sizes []int) ([]byte, error) {
	r := rand.New(rand.NewPCG(seed, 1))
	data := rand.New(rand.NewPCG(seed, 2))
	h := sha256.New()
	buf := make([]byte, 0, 1<<20)
	for sent := 0; sent < total; {
		n := min(pickSize(r, sizes, 300<<10), total-sent)
		if cap(buf) < n {
			buf = make([]byte, 0, n)
		}
		b := buf[:n]
		for i := range b {
			b[i] = byte(data.Uint32())
		}
		h.Write(b)
		for len(b) > 0 {
			m, err := w.Write(b)
			b = b[m:]
			sent += m
			if err != nil {
				return nil, fmt.Errorf("write after %d bytes: %w", sent, err)
			}
		}
		// Sometimes reuse the buffer at once: a copied write must not
		// care, a zero-copy one has returned only when the peer took it.
		for i, b2 := 0, buf[:n]; i < n; i++ {
			b2[i] = 0xEE
		}
	}
	return h.Sum(nil), nil
}

// readStream reads until EOF in reads of sizes around the thresholds and
// returns the hash and the count.
func readStream(rd io.Reader, seed uint64, sizes []int) ([]byte, int, error) {
	r := rand.New(rand.NewPCG(seed, 3))
	h := sha256.New()
	buf := make([]byte, 1<<20)
	total := 0
	for {
		n := min(pickSize(r, sizes, 300<<10), len(buf))
		m, err := rd.Read(buf[:n])
		h.Write(buf[:m])
		total += m
		if err == io.EOF {
			return h.Sum(nil), total, nil
		}
		if err != nil {
			return nil, total, fmt.Errorf("read after %d bytes: %w", total, err)
		}
	}
}

// integrityModes are the configurations every integrity test runs:
// both rendezvous, and every source choice.
func integrityModes() map[string][2]Config {
	modes := map[string][2]Config{}
	for _, zc := range []ZeroCopy{ZeroCopyAuto, ZeroCopyAlways, ZeroCopyNever} {
		w := smallConfig()
		w.ZeroCopy = zc
		r := smallConfig()
		modes["read/"+zc.String()] = [2]Config{w, r}
		r.NoRDMARead = true
		modes["write/"+zc.String()] = [2]Config{w, r}
	}
	// Split transfers, on any memory (splitAnyMemory): small enough to
	// split often, at every threshold.
	w, r := smallConfig(), smallConfig()
	w.SplitMin, r.SplitMin = 16<<10, 16<<10
	modes["read/split"] = [2]Config{w, r}
	// A writer of version 5, whose data messages count one credit each.
	w, r = smallConfig(), smallConfig()
	w.versions = [2]uint16{1, 5}
	modes["read/version5"] = [2]Config{w, r}
	return modes
}

// splitAnyMemory lets the connections of this process split transfers
// of memory that is not in huge pages (small test buffers), until the
// test ends (tb nil: for good, in a child).
// An offer left unsplit is followed by the next at once.
func splitAnyMemory(tb testing.TB) {
	old, retry := hugeBacked, splitRetry
	hugeBacked = func([]byte) bool { return true }
	splitRetry = 0
	if tb != nil {
		tb.Cleanup(func() { hugeBacked, splitRetry = old, retry })
	}
}

// scaled returns n, or a quarter of it under the race detector.
func scaled(n int) int {
	if raceEnabled {
		return n / 4
	}
	return n
}

func TestIntegrity(t *testing.T) {
	total := scaled(6 << 20)
	for name, cfgs := range integrityModes() {
		t.Run(name, func(t *testing.T) {
			w, r := cfgs[0], cfgs[1]
			if name == "read/split" {
				splitAnyMemory(t)
			}
			sizes := sizesAround(w)
			client, server := pipe(t, &w, &r)
			done := make(chan error, 1)
			var want []byte
			go func() {
				var err error
				want, err = writeStream(client, 7, total, sizes)
				if err == nil {
					err = client.(*Conn).CloseWrite()
				}
				done <- err
			}()
			got, n, err := readStream(server, 8, sizes)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if n != total || !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes of %d; hash %x, want %x", n, total, got, want)
			}
			st := client.(*Conn).Stats()
			t.Logf("writer: eager %d inline %d read-rdv %d write-rdv %d zero-copy %d copied %d fallbacks %d",
				st.BytesEager, st.BytesInline, st.BytesReadRendezvous, st.BytesWriteRendezvous, st.BytesZeroCopy, st.BytesCopied, st.Fallbacks)
			rs := server.(*Conn).Stats()
			t.Logf("reader: direct %d staged %d rdma reads %d splits %d", rs.BytesDirect, rs.BytesStaged, rs.RDMAReads, rs.Splits)
			if rs.BytesRead != uint64(total) {
				t.Fatalf("reader counted %d bytes", rs.BytesRead)
			}
			if name == "read/split" && (rs.Splits == 0 || st.BytesSplitTail == 0) {
				t.Fatalf("no transfer split: reader %d splits, writer wrote %d tail bytes", rs.Splits, st.BytesSplitTail)
			}
		})
	}
}

// Cross-process integrity: a child sinks or sources a stream.
//
//	args: mode (sink|source) | listen address | config name | seed | total
//
// sink: accepts one connection, reads until EOF, writes the hash back.
// source: accepts one connection, writes the stream, closes; the parent
// checks the hash it computes itself.
func init() {
	testutil.RegisterChild("stream", func(args []string) error {
		mode, addr, cfgName := args[0], args[1], args[2]
		seed, _ := strconv.ParseUint(args[3], 10, 64)
		total, _ := strconv.Atoi(args[4])
		cfgs, ok := integrityModes()[cfgName]
		if !ok {
			return fmt.Errorf("no mode %q", cfgName)
		}
		if cfgName == "read/split" {
			splitAnyMemory(nil)
		}
		lc := ListenConfig{Config: &cfgs[1]}
		if mode == "source" {
			lc.Config = &cfgs[0]
		}
		ln, err := lc.Listen(context.Background(), "sandirect", addr)
		if err != nil {
			return err
		}
		fmt.Println("listening")
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return err
		}
		defer c.Close()
		sizes := sizesAround(cfgs[0])
		if mode == "sink" {
			sum, n, err := readStream(c, seed, sizes)
			if err != nil {
				return err
			}
			if n != total {
				return fmt.Errorf("read %d bytes, want %d", n, total)
			}
			_, err = c.Write(sum)
			return err
		}
		if _, err := writeStream(c, seed, total, sizes); err != nil {
			return err
		}
		c.Close()
		return Flush(context.Background())
	})
}

// dialChild dials addr until the child listens there.
func dialChild(t *testing.T, child *testutil.Child, cfg *Config, network, addr string) net.Conn {
	t.Helper()
	d := Dialer{Config: cfg}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := d.Dial(network, addr)
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial %s: %v\n%s", addr, err, child.Output())
		}
		select {
		case <-child.Done():
			t.Fatalf("child exited: %s", child.Output())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func TestIntegrityAcrossProcesses(t *testing.T) {
	total := scaled(8 << 20)
	for _, tc := range []struct{ name, mode string }{
		{"read/auto", "sink"}, {"read/always", "source"}, {"read/never", "sink"},
		{"write/auto", "source"}, {"write/never", "sink"}, {"write/always", "source"},
		{"read/split", "sink"}, {"read/split", "source"},
		{"read/version5", "sink"}, {"read/version5", "source"},
	} {
		name, mode := tc.name, tc.mode
		{
			t.Run(name+"/"+mode, func(t *testing.T) {
				cfgs := integrityModes()[name]
				if name == "read/split" {
					splitAnyMemory(t)
				}
				addr := testAddr()
				child := testutil.StartChild(t, "stream", nil, mode, addr, name, "11", strconv.Itoa(total))
				if mode == "sink" {
					w := cfgs[0]
					c := dialChild(t, child, &w, "sandirect", addr)
					defer c.Close()
					want, err := writeStream(c, 11, total, sizesAround(w))
					if err != nil {
						t.Fatal(err)
					}
					c.(*Conn).CloseWrite()
					got := make([]byte, sha256.Size)
					if _, err := io.ReadFull(c, got); err != nil {
						t.Fatalf("hash: %v\n%s", err, child.Output())
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("child hashed %x, want %x", got, want)
					}
					if st := c.(*Conn).Stats(); name == "read/split" && st.BytesSplitTail == 0 {
						t.Fatalf("no transfer split: %d split offers, no tail written", st.ZeroSplit)
					}
				} else {
					r := cfgs[1]
					c := dialChild(t, child, &r, "sandirect", addr)
					defer c.Close()
					got, n, err := readStream(c, 11, sizesAround(cfgs[0]))
					if err != nil {
						t.Fatalf("%v\n%s", err, child.Output())
					}
					want, _ := writeStream(io.Discard, 11, total, sizesAround(cfgs[0]))
					if n != total || !bytes.Equal(got, want) {
						t.Fatalf("read %d bytes, hash %x, want %x", n, got, want)
					}
					if st := c.(*Conn).Stats(); name == "read/split" && st.Splits == 0 {
						t.Fatal("no transfer split")
					}
				}
				if err := child.Wait(20 * time.Second); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
