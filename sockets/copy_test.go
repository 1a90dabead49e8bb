package sockets

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// randomBytes returns n pseudo-random bytes from seed.
func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// chunkyReader reads from r in pieces of sizes around the thresholds, as
// a socket returns what has arrived.
type chunkyReader struct {
	r     io.Reader
	rnd   *rand.Rand
	sizes []int
}

func (c *chunkyReader) Read(b []byte) (int, error) {
	return c.r.Read(b[:min(len(b), pickSize(c.rnd, c.sizes, 300<<10))])
}

// copyTotals are the stream lengths of TestCopy: around every threshold
// of cfg, and one of several rendezvous.
func copyTotals(cfg Config) []int {
	var totals []int
	for _, n := range sizesAround(cfg) {
		if n <= 4<<20 {
			totals = append(totals, n)
		}
	}
	return append(totals, scaled(3<<20)+12345)
}

// TestCopy checks io.Copy through Conn.ReadFrom and Conn.WriteTo, hash
// checked: a file into a Conn and out into a file, a Conn into a buffer,
// a reader of short reads into a Conn, a proxy from one Conn into
// another, and an echo of a Conn into itself.
func TestCopy(t *testing.T) {
	modes := integrityModes()
	for _, name := range []string{"read/auto", "write/auto", "read/always", "default"} {
		t.Run(name, func(t *testing.T) {
			var w, r Config
			if name != "default" {
				w, r = modes[name][0], modes[name][1]
			}
			for _, tc := range []struct {
				name string
				run  func(t *testing.T, w, r *Config, data []byte) []byte
			}{
				{"file", copyFileToFile},
				{"buffer", copyShortReadsToBuffer},
				{"proxy", copyThroughProxy},
				{"echo", copyEcho},
			} {
				t.Run(tc.name, func(t *testing.T) {
					for i, total := range copyTotals(w) {
						data := randomBytes(uint64(i), total)
						got := tc.run(t, &w, &r, data)
						if t.Failed() {
							return
						}
						if len(got) != total || sha256.Sum256(got) != sha256.Sum256(data) {
							t.Fatalf("%d bytes: got %d, not the bytes sent", total, len(got))
						}
					}
				})
			}
		})
	}
}

// copyFileToFile copies data from a file into a Conn (io.Copy, which
// takes Conn.ReadFrom) and out of the other end into a file (WriteTo).
func copyFileToFile(t *testing.T, w, r *Config, data []byte) []byte {
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	client, server := pipe(t, w, r)
	errc := make(chan error, 1)
	go func() {
		f, err := os.Open(in)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		n, err := io.Copy(client, f)
		if err == nil && n != int64(len(data)) {
			err = errors.New("short copy into the connection")
		}
		if err == nil {
			err = client.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	n, err := server.(*Conn).WriteTo(out)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("WriteTo a file: %d of %d bytes, %v", n, len(data), err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// copyShortReadsToBuffer reads data in short pieces into a Conn
// (ReadFrom) and copies the other end into a bytes.Buffer (io.Copy, which
// takes WriteTo).
func copyShortReadsToBuffer(t *testing.T, w, r *Config, data []byte) []byte {
	client, server := pipe(t, w, r)
	errc := make(chan error, 1)
	go func() {
		src := &chunkyReader{bytes.NewReader(data), rand.New(rand.NewPCG(3, 4)), sizesAround(*w)}
		n, err := client.(*Conn).ReadFrom(src)
		if err == nil && n != int64(len(data)) {
			err = errors.New("short ReadFrom")
		}
		if err == nil {
			err = client.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, server); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// copyThroughProxy sends data through a proxy: io.Copy from one Conn into
// another (WriteTo into a Conn, whose Write runs while data is lent).
func copyThroughProxy(t *testing.T, w, r *Config, data []byte) []byte {
	c1, s1 := pipe(t, w, r)
	c2, s2 := pipe(t, w, r)
	errc := make(chan error, 2)
	go func() {
		_, err := c1.Write(data)
		if err == nil {
			err = c1.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := io.Copy(c2, s1)
		if err == nil {
			err = c2.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(s2)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// copyEcho echoes data with io.Copy of a Conn into itself: WriteTo's
// destination is its own connection.
func copyEcho(t *testing.T, w, r *Config, data []byte) []byte {
	client, server := pipe(t, w, r)
	errc := make(chan error, 2)
	go func() {
		_, err := io.Copy(server, server)
		if err == nil {
			err = server.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := client.Write(data)
		if err == nil {
			err = client.(*Conn).CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(client)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// TestCopyErrors checks WriteTo's and ReadFrom's error contract: a
// destination's error and a source's come back wrapped, a read deadline
// ends WriteTo, and ReadFrom after CloseWrite fails with EPIPE.
func TestCopyErrors(t *testing.T) {
	client, server := pipe(t, nil, nil)
	sc := server.(*Conn)
	boom := errors.New("boom")
	go client.Write([]byte("hello"))
	if _, err := sc.WriteTo(failingWriter{boom}); !errors.Is(err, boom) || !isOpError(err) {
		t.Fatalf("WriteTo a failing writer: %v", err)
	}
	sc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := sc.WriteTo(io.Discard); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WriteTo past its deadline: %v", err)
	}
	sc.SetReadDeadline(time.Time{})
	cc := client.(*Conn)
	if _, err := cc.ReadFrom(failingReader{boom}); !errors.Is(err, boom) || !isOpError(err) {
		t.Fatalf("ReadFrom a failing reader: %v", err)
	}
	cc.CloseWrite()
	if _, err := cc.ReadFrom(bytes.NewReader([]byte("x"))); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("ReadFrom after CloseWrite: %v", err)
	}
	// The stream still works: what was written arrives, then EOF.
	var buf bytes.Buffer
	if n, err := sc.WriteTo(&buf); n != 0 || err != nil {
		t.Fatalf("WriteTo at EOF: %d, %v", n, err)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

func isOpError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}
