package sockets

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Frames of TestConcurrentWrites: each Write is one frame, a header and a
// body whose every byte follows from the writer, the frame's number and
// the byte's offset, so that any byte of another Write inside it shows.
//
//	0 u32 writer | 4 u32 frame number | 8 u32 body length | 12 body
const frameHeader = 12

// frameByte is byte i of the body of frame seq of writer w.
func frameByte(w, seq uint32, i int) byte {
	x := uint64(w)<<40 ^ uint64(seq)<<20 ^ uint64(i)
	x *= 0x9e3779b97f4a7c15
	return byte(x >> 56)
}

func fillFrame(b []byte, w, seq uint32) {
	binary.LittleEndian.PutUint32(b[0:], w)
	binary.LittleEndian.PutUint32(b[4:], seq)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(b)-frameHeader))
	for i := range b[frameHeader:] {
		b[frameHeader+i] = frameByte(w, seq, i)
	}
}

// readFrames reads frames until EOF and checks that each is whole and in
// its writer's order; it returns the frames read per writer.
func readFrames(r io.Reader, writers int) ([]uint32, error) {
	next := make([]uint32, writers)
	var hdr [frameHeader]byte
	var body []byte
	for n := 0; ; n++ {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err == io.EOF {
				return next, nil
			}
			return next, fmt.Errorf("frame %d: header: %w", n, err)
		}
		w := binary.LittleEndian.Uint32(hdr[0:])
		seq := binary.LittleEndian.Uint32(hdr[4:])
		size := int(binary.LittleEndian.Uint32(hdr[8:]))
		if int(w) >= writers || seq != next[w] || size > 4<<20+300<<10 {
			return next, fmt.Errorf("frame %d: header of writer %d frame %d (%d bytes): another Write's bytes inside a frame", n, w, seq, size)
		}
		if cap(body) < size {
			body = make([]byte, size)
		}
		body = body[:size]
		if _, err := io.ReadFull(r, body); err != nil {
			return next, fmt.Errorf("frame %d (writer %d, %d of its frames): body: %w", n, w, seq, err)
		}
		for i, b := range body {
			if b != frameByte(w, seq, i) {
				return next, fmt.Errorf("writer %d frame %d: byte %d of %d is not its own", w, seq, i, size)
			}
		}
		next[w]++
	}
}

// TestConcurrentWrites checks the package's promise that one Write's
// bytes are never interleaved with another's: goroutines write frames of
// sizes across the eager threshold and every rendezvous size at once, and
// the reader finds every frame whole, in each writer's order.
func TestConcurrentWrites(t *testing.T) {
	const writers = 4
	frames := scaled(48)
	modes := integrityModes()
	for _, name := range []string{"read/auto", "read/always", "read/never", "write/auto", "default"} {
		t.Run(name, func(t *testing.T) {
			var w, r Config
			if name != "default" {
				w, r = modes[name][0], modes[name][1]
			}
			// Writes of several rendezvous, but not of 16 MiB (the
			// default MaxTransfer): the smaller configurations' cross it.
			var sizes []int
			for _, n := range sizesAround(w) {
				if n <= 4<<20 {
					sizes = append(sizes, n)
				}
			}
			client, server := pipe(t, &w, &r)
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for id := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rnd := rand.New(rand.NewPCG(uint64(id), 5))
					for seq := range frames {
						n := frameHeader + pickSize(rnd, sizes, 300<<10)
						b := make([]byte, n)
						fillFrame(b, uint32(id), uint32(seq))
						if m, err := client.Write(b); err != nil || m != n {
							errs <- fmt.Errorf("writer %d frame %d: wrote %d of %d: %v", id, seq, m, n, err)
							return
						}
					}
				}()
			}
			go func() {
				wg.Wait()
				errs <- client.(*Conn).CloseWrite()
				close(errs)
			}()
			got, err := readFrames(server, writers)
			if err != nil {
				t.Fatal(err)
			}
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			for id, n := range got {
				if n != uint32(frames) {
					t.Errorf("writer %d: %d frames read, wrote %d", id, n, frames)
				}
			}
		})
	}
}

// TestFullDuplex streams in both directions at once, each side's Writes
// and Reads from goroutines of their own, and checks both streams' hashes.
func TestFullDuplex(t *testing.T) {
	total := scaled(4 << 20)
	modes := integrityModes()
	for _, name := range []string{"read/auto", "write/auto", "read/never", "default"} {
		t.Run(name, func(t *testing.T) {
			var w, r Config
			if name != "default" {
				w, r = modes[name][0], modes[name][1]
			}
			sizes := sizesAround(w)
			client, server := pipe(t, &w, &r)
			type result struct {
				sum []byte
				n   int
				err error
			}
			wrote := make([]chan result, 2)
			read := make([]chan result, 2)
			for i, c := range []net.Conn{client, server} {
				wrote[i], read[i] = make(chan result, 1), make(chan result, 1)
				seed := uint64(20 + i)
				go func() {
					sum, err := writeStream(c, seed, total, sizes)
					if err == nil {
						err = c.(*Conn).CloseWrite()
					}
					wrote[i] <- result{sum: sum, err: err}
				}()
				go func() {
					sum, n, err := readStream(c, seed+10, sizes)
					read[i] <- result{sum, n, err}
				}()
			}
			for i, dir := range []string{"client to server", "server to client"} {
				w, r := <-wrote[i], <-read[1-i]
				if err := errors.Join(w.err, r.err); err != nil {
					t.Fatalf("%s: %v", dir, err)
				}
				if r.n != total || !bytes.Equal(r.sum, w.sum) {
					t.Errorf("%s: read %d bytes of %d, hash %x, want %x", dir, r.n, total, r.sum, w.sum)
				}
			}
		})
	}
}

// TestWritesBehindUnreadData: one end reads nothing while it writes two
// large messages, each of which needs the peer's done (read rendezvous),
// and the peer streams small messages to it meanwhile. The peer's dones
// come behind data nobody reads, whose ring space holds our acks back: the
// first done takes the peer's control credit, the second needs that
// credit back. The writes must finish — the blocked ring space goes back
// once the peer is short of credit (releaseLocked) — and both streams
// arrive intact. Acks that wait for the data to be read and never for
// the peer's credit hang the second write.
func TestWritesBehindUnreadData(t *testing.T) {
	cfg := &Config{ZeroCopy: ZeroCopyAlways}
	a, b := pipe(t, cfg, cfg)
	const small, count = 256, 400
	bwrote := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < count && err == nil; i++ {
			_, err = b.Write(pattern(i*small, small))
		}
		bwrote <- err
	}()
	waitFor(t, "the small writes to stall on credit", func() bool { return b.(*Conn).Stats().CreditStalls > 0 })
	const big = 1 << 20
	type result struct {
		got []byte
		err error
	}
	bread := make(chan result, 1)
	go func() {
		got := make([]byte, 2*big)
		_, err := io.ReadFull(b, got)
		bread <- result{got, err}
	}()
	a.SetWriteDeadline(time.Now().Add(20 * time.Second))
	for i := range 2 {
		if _, err := a.Write(pattern(i*big, big)); err != nil {
			t.Fatalf("write %d of %d bytes behind unread data: %v (%s)", i, big, err, a.(*Conn).debugState())
		}
	}
	r := <-bread
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !bytes.Equal(r.got, pattern(0, 2*big)) {
		t.Error("the large writes arrived altered")
	}
	got := make([]byte, small*count)
	a.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(a, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, pattern(0, small*count)) {
		t.Error("the small writes arrived altered")
	}
	if err := <-bwrote; err != nil {
		t.Fatal(err)
	}
}
