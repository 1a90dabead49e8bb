package main

// Suite pin: the registration cache. Register+Deregister of one buffer, the
// same buffer each time as an application that reuses its buffers does,
// with the cache on (pin/cached: a hit after the first miss, no system
// call) and off (pin/uncached: every Register locks the pages, every
// Deregister unlocks them). The buffer is foreign memory (an anonymous
// mapping), watched by the best monitor this process can run. One process:
// registration involves no peer. The number is the whole Register+
// Deregister pair, not half of it.

import (
	"context"
	"fmt"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/pin"
)

func init() {
	register(&Suite{
		Name: "pin",
		Doc:  "registration cache: register+deregister of a reused buffer, cached vs uncached",
		Run:  runPin,
	})
	targets = append(targets, target{"pin uncached 1MiB p50 / cached 1MiB p50",
		recordKey{"pin", "register", "pin/uncached", miB, metricLatP50},
		recordKey{"pin", "register", "pin/cached", miB, metricLatP50}, 100, false})
}

func pinSizes(env *Env) []int {
	switch {
	case testTiny:
		return []int{4 * kiB, miB}
	case env.quick:
		return []int{4 * kiB, 64 * kiB, miB, 16 * miB, 64 * miB}
	}
	return pow2Sizes(4*kiB, 64*miB, 4)
}

func runPin(ctx context.Context, env *Env) (recs []Record, err error) {
	for _, size := range pinSizes(env) {
		buf, err := sys.MapAnon(size)
		if err != nil {
			return recs, err
		}
		for i := 0; i < size; i += 4096 {
			buf[i] = 1 // touched, as a buffer in use is
		}
		for _, mode := range []struct {
			name    string
			monitor pin.MonitorKind
		}{{"pin/cached", pin.MonitorAuto}, {"pin/uncached", pin.MonitorNone}} {
			if err := ctx.Err(); err != nil {
				sys.Munmap(buf)
				return recs, err
			}
			lat, err := pinRegisterLatency(env, buf, mode.monitor)
			if err != nil {
				sys.Munmap(buf)
				return recs, fmt.Errorf("%s %d B: %w", mode.name, size, err)
			}
			recs = append(recs, env.Report(Result{Case: "register", Transport: mode.name, Size: size, Lat: lat})...)
		}
		sys.Munmap(buf)
	}
	return recs, nil
}

func pinRegisterLatency(env *Env, buf []byte, monitor pin.MonitorKind) (*Latency, error) {
	c, err := pin.New(&pin.Config{Monitor: monitor})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// Slow (uncached) registrations of large buffers take milliseconds:
	// fewer samples, same time budget.
	smp := newSampler(min(env.plan.latMax, 100_000))
	one := func() error {
		h, err := c.Register(buf, 0)
		if err != nil {
			return err
		}
		return c.Deregister(h)
	}
	for range 10 {
		if err := one(); err != nil {
			return nil, err
		}
	}
	smp.start(max(env.plan.latTime/2, time.Millisecond))
	for {
		if err := one(); err != nil {
			return nil, err
		}
		if !smp.lap() {
			break
		}
	}
	rt := smp.result()
	for i := range rt {
		rt[i] *= 2 // report the whole pair
	}
	return summarize(rt), nil
}
