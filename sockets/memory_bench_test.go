package sockets

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"

	"github.com/sandirect/sandirect/internal/sys"
)

// BenchmarkConnMemory opens b.N connections in this process and reports
// the memory that using them adds: this process's proportional set size
// (Pss: the rings are shared memory that both ends map, counted once) after
// each direction of each connection moved twice a ring's worth in 8 KiB
// writes — so that both rings have been written through, as a busy
// connection's are — over what it was with the same connections just
// dialed (the conn suite of the bench measures those, across two
// processes). For the default window and for 24. Run it with a fixed
// count, e.g. -benchtime 32x.
func BenchmarkConnMemory(b *testing.B) {
	for _, window := range []int{0, 24} {
		b.Run("window="+windowName(window), func(b *testing.B) {
			cfg := &Config{Window: window}
			conns := make([][2]net.Conn, b.N)
			for i := range conns {
				c, s := pipe(b, cfg, cfg)
				conns[i] = [2]net.Conn{c, s}
			}
			runtime.GC()
			debug.FreeOSMemory()
			before, err := sys.Pss("self")
			if err != nil {
				b.Skip(err)
			}
			n := 2 * ringCapacity(int(conns[0][0].(*Conn).window), conns[0][0].(*Conn).bufSize)
			for _, p := range conns {
				if err := streamThrough(p[0], p[1], n); err != nil {
					b.Fatal(err)
				}
				if err := streamThrough(p[1], p[0], n); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			runtime.GC()
			debug.FreeOSMemory()
			after, err := sys.Pss("self")
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(after-before)/float64(b.N)/1024, "used-KiB/conn")
			b.ReportMetric(float64(n)/1024, "KiB-moved/dir")
		})
	}
}

func windowName(w int) string {
	if w == 0 {
		return "default"
	}
	return strconv.Itoa(w)
}

// streamThrough writes n bytes into w in 8 KiB writes, one message each,
// and reads them at r, checked.
func streamThrough(w, r net.Conn, n int) error {
	const chunk = 8 << 10
	out := bytes.Repeat([]byte{0xa5}, chunk)
	errc := make(chan error, 1)
	go func() {
		for sent := 0; sent < n; sent += chunk {
			if _, err := w.Write(out); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	in := make([]byte, chunk)
	for got := 0; got < n; got += chunk {
		if _, err := io.ReadFull(r, in); err != nil {
			return err
		}
		if !bytes.Equal(in, out) {
			return errors.New("the bytes read differ from those written")
		}
	}
	return <-errc
}
