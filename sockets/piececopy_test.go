package sockets

import (
	"bytes"
	"crypto/sha256"
	"io"
	"testing"
	"time"
)

// TestPieceCopierChoice drives the copier's choice with made-up costs: it
// measures both ways in runs whose first warmBytes are not counted, uses
// the faster, tries the other again every copierRetry, and follows a change
// of which is faster.
func TestPieceCopierChoice(t *testing.T) {
	var p pieceCopier
	now := time.Unix(1000, 0)
	const step = 100 * time.Microsecond // one piece
	ntFaster := true
	const size = 1 << 20
	piece := func() bool {
		nt, count := p.choose(now, size)
		if count {
			d := 300 * time.Microsecond // the slow way
			if nt == ntFaster {
				d = 100 * time.Microsecond
			}
			p.record(nt, size, d)
		}
		now = now.Add(step)
		return nt
	}
	run := (warmBytes + trialBytes) / size
	for i := range 2 * run {
		if got, want := piece(), i >= run; got != want {
			t.Fatalf("piece %d: non-temporal %v, want %v (cached run, then non-temporal run)", i, got, want)
		}
	}
	// Steady: non-temporal until copierRetry has passed since the cached
	// run began, then one cached trial run, then non-temporal again.
	cachedRuns, inCached := 0, false
	for range int(2*copierRetry/step) + 2*run {
		nt := piece()
		if !nt && !inCached {
			cachedRuns++
		}
		inCached = !nt
	}
	if cachedRuns != 2 {
		t.Fatalf("%d cached trial runs in %v, want 2 (one every %v)", cachedRuns, 2*copierRetry, copierRetry)
	}
	if cached, nt := p.rates(); nt <= cached {
		t.Fatalf("rates: cached %.2f, non-temporal %.2f bytes/ns; non-temporal was made faster", cached, nt)
	}
	// The machine changes: cached is faster now. Within two retry periods
	// the copier settles on cached.
	ntFaster = false
	for range int(2 * copierRetry / step) {
		piece()
	}
	for i := range 100 {
		if piece() {
			t.Fatalf("piece %d after the change: still non-temporal (rates %v)", i, p.rate)
		}
	}
}

// TestCopiedPiecesBothWays streams 1 MiB writes, each copied in pieces,
// through a fresh device: the copier's first runs take both ways, and every
// byte arrives intact either way.
func TestCopiedPiecesBothWays(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxRegions = 4093 // a device of its own: its copier starts afresh
	client, server := pipe(t, &cfg, &cfg)
	const writes = 40
	msg := make([]byte, 1<<20)
	wantH := sha256.New()
	errc := make(chan error, 1)
	go func() {
		for i := range writes {
			for j := range msg {
				msg[j] = byte(i*131 + j*7 + j>>10)
			}
			wantH.Write(msg)
			if _, err := client.Write(msg); err != nil {
				errc <- err
				return
			}
		}
		errc <- client.(*Conn).CloseWrite()
	}()
	gotH := sha256.New()
	n, err := io.Copy(gotH, server)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if n != writes<<20 || !bytes.Equal(gotH.Sum(nil), wantH.Sum(nil)) {
		t.Fatalf("read %d bytes of %d, or the hashes differ", n, writes<<20)
	}
	st := client.(*Conn).Stats()
	t.Logf("copied %d bytes, %d of them non-temporal", st.BytesCopied, st.BytesCopiedNT)
	if st.BytesCopiedNT == 0 || st.BytesCopiedNT >= st.BytesCopied {
		t.Fatalf("copied %d bytes, %d non-temporal: want both ways used", st.BytesCopied, st.BytesCopiedNT)
	}
}

// rates returns the copier's averages (bytes per ns) of the two ways.
func (p *pieceCopier) rates() (cached, nt float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate[0], p.rate[1]
}
