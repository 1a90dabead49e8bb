package sockets

import (
	"bytes"
	"io"
	"testing"
)

// TestTwoUnitData: from version 6 an eager write goes in data messages of
// two credits' payload, which the reader takes whole, a piece at a time,
// or lent to WriteTo, with the credits coming back in the same units; an
// older peer gets messages of one credit.
func TestTwoUnitData(t *testing.T) {
	for _, tc := range []struct {
		name     string
		versions [2]uint16
		units    int // credits a full message counts
	}{
		{"version6", [2]uint16{}, 2},
		{"version5", [2]uint16{1, 5}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{versions: tc.versions}
			client, server := pipe(t, &cfg, nil)
			w, r := client.(*Conn), server.(*Conn)
			if w.maxData != tc.units*w.maxPayload || r.maxData != w.maxData {
				t.Fatalf("largest data payload %d and %d, want %d × %d", w.maxData, r.maxData, tc.units, w.maxPayload)
			}
			size := 4 * w.maxPayload // eager: well within the credits
			want := randBytes(size)
			write := func(i int) {
				t.Helper()
				before := w.Stats().MsgsSent
				if _, err := client.Write(want); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				// The reader's credit messages have come by the time its
				// Read returned: the write goes eager, in full messages.
				if n := w.Stats().MsgsSent - before; n != uint64(4/tc.units) {
					t.Fatalf("write %d went as %d messages, want %d", i, n, 4/tc.units)
				}
			}
			got := make([]byte, size)
			rounds := 3 * int(w.peerWindow)
			var base uint32 // units received before the first write
			for i := 0; i < rounds; i++ {
				write(i)
				var err error
				if i%2 == 0 {
					_, err = io.ReadFull(server, got)
				} else {
					// In pieces smaller than a message: the rest waits in
					// the ring, holding its credits.
					for n := 0; n < size && err == nil; {
						var k int
						k, err = server.Read(got[n:min(size, n+1000)])
						n += k
					}
				}
				if err != nil {
					t.Fatalf("read %d: %v", i, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("read %d: the bytes differ", i)
				}
				if i == 0 {
					r.mu.Lock()
					base = r.received - 4
					r.mu.Unlock()
				}
			}
			// Lent to WriteTo, a message at a time.
			for i := 0; i < 3; i++ {
				write(rounds + i)
			}
			if err := w.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if n, err := r.WriteTo(&buf); err != nil || n != int64(3*size) {
				t.Fatalf("WriteTo: %d bytes, %v; want %d", n, err, 3*size)
			}
			if !bytes.Equal(buf.Bytes(), bytes.Repeat(want, 3)) {
				t.Fatal("WriteTo: the bytes differ")
			}
			// Everything read is given back, counted in the units it was
			// sent in (the fin counts one).
			r.mu.Lock()
			received, consumed, taken, held := r.received, r.consumed, r.taken, r.heldN
			r.mu.Unlock()
			if received != consumed || uint64(received) != taken || held != 0 {
				t.Fatalf("reader: received %d, consumed %d, taken %d units, %d held", received, consumed, taken, held)
			}
			if n, want := received-base, uint32((rounds+3)*4+1); n != want { // and the fin
				t.Fatalf("reader: received %d units, want %d", n, want)
			}
		})
	}
}
