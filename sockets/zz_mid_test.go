package sockets

import (
	"fmt"
	"io"
	"testing"

	"github.com/sandirect/sandirect/shm"
)

func init() {
	busy := shm.WaitConfig{Mode: shm.WaitBusyPoll}
	for _, v := range []struct {
		name          string
		buf, win, eag int
	}{
		{"v-4k-8-16k", 4096, 8, 16 << 10},
		{"v-4k-32-16k", 4096, 32, 16 << 10},
		{"v-8k-16-64k", 8192, 16, 64 << 10},
		{"v-8k-16-256k", 8192, 16, 256 << 10},
		{"v-16k-16-256k", 16384, 16, 256 << 10},
		{"v-16k-8-64k", 16384, 8, 64 << 10},
		{"v-32k-8-256k", 32768, 8, 256 << 10},
		{"v-8k-32-256k", 8192, 32, 256 << 10},
	} {
		benchConfigs[v.name] = &Config{Wait: busy, BufferSize: v.buf, Window: v.win, EagerThreshold: v.eag}
	}
}

func BenchmarkZZMid(b *testing.B) {
	for _, tr := range []string{"v-4k-8-16k", "v-4k-32-16k", "v-8k-16-64k", "v-8k-16-256k", "v-16k-16-256k", "v-16k-8-64k", "v-32k-8-256k", "v-8k-32-256k"} {
		for _, size := range []int{64, 4096, 64 << 10, 256 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("pp/transport=%s/size=%s", tr, sizeName(size)), func(b *testing.B) {
				c := benchServer(b, tr, "echo")()
				defer c.Close()
				buf := make([]byte, size)
				for b.Loop() {
					c.Write(buf)
					io.ReadFull(c, buf)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/half-rtt")
			})
			b.Run(fmt.Sprintf("st/transport=%s/size=%s", tr, sizeName(size)), func(b *testing.B) {
				c := benchServer(b, tr, "sink")()
				defer c.Close()
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				for b.Loop() {
					c.Write(buf)
				}
				c.(interface{ CloseWrite() error }).CloseWrite()
				io.ReadFull(c, buf[:1])
			})
		}
	}
}
