package sockets

import (
	"fmt"
	"io"
	"testing"

	"github.com/sandirect/sandirect/shm"
)

func init() {
	// Version 3's defaults: 4 KiB messages, a window of 8, writes above
	// 16 KiB by rendezvous. The baselines of BenchmarkEager.
	for name, wait := range map[string]shm.WaitConfig{"busy-rdv": {Mode: shm.WaitBusyPoll}, "adaptive-rdv": {}} {
		benchConfigs[name] = &Config{Wait: wait, BufferSize: 4096, Window: 8, EagerThreshold: 16 << 10}
	}
}

// BenchmarkEager measures mid-size writes to another process, ping-pong
// and streaming, as eager data messages in pipelined fragments (the
// defaults) and by rendezvous (*-rdv: the defaults of protocol version
// 3), waiting as by default and busy polling. Both processes run
// unpinned here: busy polling is at the mercy of the scheduler (the conn
// suite of the bench pins them). docs/protocol.md, "Eager", has figures.
func BenchmarkEager(b *testing.B) {
	for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 128 << 10, 256 << 10} {
		for _, tr := range []string{"adaptive", "adaptive-rdv", "busy", "busy-rdv"} {
			b.Run(fmt.Sprintf("case=pingpong/transport=%s/size=%s", tr, sizeName(size)), func(b *testing.B) {
				pingPong(b, tr, size) // bench_test.go
			})
			b.Run(fmt.Sprintf("case=stream/transport=%s/size=%s", tr, sizeName(size)), func(b *testing.B) {
				c := benchServer(b, tr, "sink")()
				defer c.Close()
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				c.(interface{ CloseWrite() error }).CloseWrite()
				if _, err := io.ReadFull(c, buf[:1]); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
