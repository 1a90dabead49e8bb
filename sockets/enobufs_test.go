package sockets

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"syscall"
	"testing"
)

// TestENOBUFS runs out of registrations, pinning budget and temporary
// memory on the writing side: no write fails, the writes that cannot
// register what they need take a path that needs less (a copy, smaller
// pieces, small messages: lowmem.go), and the reader gets every byte
// once.
func TestENOBUFS(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxRegions int // the doorbell takes 1
		tempMemory int
		zeroCopy   ZeroCopy
		noRead     bool
		fallback   bool  // some write must take another path
		maxPinned  int64 // the writer's pinning budget; 0: default
	}{
		{"no-region", 1, 0, ZeroCopyAuto, false, true, 0},
		{"no-region/write", 1, 0, ZeroCopyAuto, true, true, 0},
		{"one-region", 2, 0, ZeroCopyNever, false, false, 0},
		{"no-temp-memory", 2, 64 << 10, ZeroCopyNever, false, false, 0},
		{"no-temp-memory/no-region", 1, 64 << 10, ZeroCopyNever, false, true, 0},
		// The doorbell fits in 48 KiB; no source or 64 KiB copy does.
		{"pinned-bytes", 4096, 0, ZeroCopyAuto, false, true, 48 << 10},
		{"pinned-bytes/write", 4096, 0, ZeroCopyAuto, true, true, 48 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := smallConfig()
			w.MaxRegions = tc.maxRegions
			w.ZeroCopy = tc.zeroCopy
			w.MaxPinnedBytes = tc.maxPinned
			if tc.tempMemory != 0 {
				w.TempMemory = tc.tempMemory
				w.CopyChunk = 128 << 10 // larger than the temporary memory
			}
			r := smallConfig()
			r.NoRDMARead = tc.noRead
			client, server := pipe(t, &w, &r)
			total := scaled(2 << 20)
			src := make([]byte, total)
			rnd := rand.New(rand.NewPCG(1, 2))
			for i := range src {
				src[i] = byte(rnd.Uint32())
			}
			done := make(chan error, 1)
			var nobufs int
			go func() {
				defer client.(*Conn).CloseWrite()
				for off := 0; off < total; {
					n := min(total-off, 100<<10+rnd.IntN(200<<10))
					m, err := client.Write(src[off : off+n])
					if m < 0 || m > n {
						done <- errors.New("bad count")
						return
					}
					off += m
					if errors.Is(err, syscall.ENOBUFS) {
						nobufs++
					}
					if err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			got, err := io.ReadAll(server)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, src) {
				t.Fatalf("got %d bytes, hash %x; want %d, %x", len(got), sha256.Sum256(got), total, sha256.Sum256(src))
			}
			st := client.(*Conn).Stats()
			t.Logf("ENOBUFS %d (counter %d), fallbacks %d, copied %d, zero-copy %d", nobufs, st.ENOBUFS, st.Fallbacks, st.BytesCopied, st.BytesZeroCopy)
			if nobufs > 0 || st.ENOBUFS != 0 || tc.fallback && st.Fallbacks == 0 {
				t.Fatalf("%d writes failed with ENOBUFS (counter %d), %d fallbacks (want some: %v)", nobufs, st.ENOBUFS, st.Fallbacks, tc.fallback)
			}
		})
	}
}
