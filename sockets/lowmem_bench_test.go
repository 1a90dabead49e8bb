package sockets

import (
	"fmt"
	"io"
	"testing"
)

// BenchmarkStreamPinBudget streams 16 MiB writes into 16 MiB ReadFulls
// between two goroutines of this process, with the default pinning budget
// and with an unprivileged user's 8 MiB (Config.MaxPinnedBytes; the two
// connections share it here, as they share their device): what a budget
// too small to pin the buffers in place costs (lowmem.go).
func BenchmarkStreamPinBudget(b *testing.B) {
	const size = 16 << 20
	for _, budget := range []int64{0, 8 << 20} {
		name := "default"
		if budget > 0 {
			name = fmt.Sprintf("%dMiB", budget>>20)
		}
		b.Run("budget="+name+"/size=16MiB", func(b *testing.B) {
			cfg := &Config{MaxPinnedBytes: budget}
			c, s := pipe(b, cfg, cfg)
			n := b.N
			errc := make(chan error, 1)
			go func() {
				buf := make([]byte, size)
				for range n {
					if _, err := c.Write(buf); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			buf := make([]byte, size)
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			for range n {
				if _, err := io.ReadFull(s, buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		})
	}
}
