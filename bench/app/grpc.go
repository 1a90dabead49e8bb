package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/interop/grpc_testing"
)

const (
	minCalls   = 5                // per slice, however short: a 1 MiB call takes milliseconds
	sliceMax   = 60 * time.Second // a slice that takes longer than this has hung
	bidiWindow = 16               // bidi: messages in flight
)

// grpcClients holds one ClientConn per transport for the whole run, as an
// application holds its channel.
type grpcClients struct {
	conns   []*grpc.ClientConn
	clients map[string]grpc_testing.BenchmarkServiceClient
}

func newGRPCClients(a serverAddrs) (*grpcClients, error) {
	g := &grpcClients{clients: map[string]grpc_testing.BenchmarkServiceClient{}}
	for _, t := range transports {
		// passthrough: the dialer gets the address as it is.
		cc, err := grpc.NewClient("passthrough:///"+a.GRPC[t.name],
			grpc.WithContextDialer(t.dial),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			g.close()
			return nil, fmt.Errorf("grpc client over %s: %w", t.name, err)
		}
		g.conns = append(g.conns, cc)
		g.clients[t.name] = grpc_testing.NewBenchmarkServiceClient(cc)
	}
	return g, nil
}

func (g *grpcClients) close() {
	for _, cc := range g.conns {
		cc.Close()
	}
}

// measureUnary interleaves the transports' unary calls, size by size. A
// transport that fails is reported and left out of that size's rounds.
func measureUnary(ctx context.Context, w *rowWriter, o options, g *grpcClients) error {
	for _, size := range o.unarySizes {
		req := &grpc_testing.SimpleRequest{ResponseSize: int32(size), Payload: &grpc_testing.Payload{Body: make([]byte, size)}}
		samples := map[string][]time.Duration{}
		failed := map[string]bool{}
		step := func(t transport, d time.Duration, keep bool) error {
			if failed[t.name] {
				return nil
			}
			s, err := unaryFor(ctx, g.clients[t.name], req, d, samples[t.name])
			if err != nil {
				failed[t.name] = true
				return w.fail(ctx, fmt.Errorf("unary %d B over %s: %w", size, t.name, err))
			}
			if keep {
				samples[t.name] = s
			}
			return nil
		}
		if err := interleave(o, step); err != nil {
			return err
		}
		for _, t := range transports {
			if !failed[t.name] {
				if err := w.row(latencyRow("unary", "grpc/"+t.name, size, samples[t.name])); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// unaryFor makes calls one after the other for d (at least minCalls) and
// appends each call's time to samples.
func unaryFor(ctx context.Context, cl grpc_testing.BenchmarkServiceClient, req *grpc_testing.SimpleRequest,
	d time.Duration, samples []time.Duration) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, d+sliceMax)
	defer cancel()
	want := int(req.GetResponseSize())
	start := time.Now()
	for n := 0; n < minCalls || time.Since(start) < d; n++ {
		t0 := time.Now()
		resp, err := cl.UnaryCall(ctx, req)
		dt := time.Since(t0)
		if err != nil {
			return samples, err
		}
		if got := len(resp.GetPayload().GetBody()); got != want {
			return samples, fmt.Errorf("response of %d bytes, want %d", got, want)
		}
		samples = append(samples, dt)
	}
	return samples, nil
}

// measureCalls interleaves the transports' concurrent unary calls: o.callers
// goroutines calling at once over one connection (the ClientConn an
// application shares between its request handlers), so that gRPC's reader
// and writer of the connection are both busy, in both processes. Its rows
// (case unary-cN) are calls per second.
func measureCalls(ctx context.Context, w *rowWriter, o options, g *grpcClients) error {
	for _, size := range o.callSizes {
		req := &grpc_testing.SimpleRequest{ResponseSize: int32(size), Payload: &grpc_testing.Payload{Body: make([]byte, size)}}
		err := measureRate(ctx, w, o, "unary-c"+strconv.Itoa(o.callers), "grpc", size, func(t transport, d time.Duration) (float64, error) {
			return callsFor(ctx, g.clients[t.name], req, o.callers, d)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// callsFor makes unary calls from callers goroutines at once for d (each
// at least minCalls) and returns the calls per second, until the last one
// returned.
func callsFor(ctx context.Context, cl grpc_testing.BenchmarkServiceClient, req *grpc_testing.SimpleRequest,
	callers int, d time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d+sliceMax)
	defer cancel()
	want := int(req.GetResponseSize())
	start := time.Now()
	var calls atomic.Int64
	errs := make(chan error, callers)
	for range callers {
		go func() {
			for n := 0; n < minCalls || time.Since(start) < d; n++ {
				resp, err := cl.UnaryCall(ctx, req)
				if err == nil && len(resp.GetPayload().GetBody()) != want {
					err = fmt.Errorf("response of %d bytes, want %d", len(resp.GetPayload().GetBody()), want)
				}
				if err != nil {
					errs <- err // first: the others' errors are the cancel's
					cancel()
					return
				}
				calls.Add(1)
			}
			errs <- nil
		}()
	}
	var first error
	for range callers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return 0, first
	}
	return float64(calls.Load()) / time.Since(start).Seconds(), nil
}

// measureBidi interleaves the transports' bidirectional streams.
func measureBidi(ctx context.Context, w *rowWriter, o options, g *grpcClients) error {
	for _, size := range o.bidiSizes {
		err := measureRate(ctx, w, o, "bidi", "grpc", size, func(t transport, d time.Duration) (float64, error) {
			return bidiFor(ctx, g.clients[t.name], size, d)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// bidiFor runs one bidirectional stream for d: one goroutine sends
// messages of size with up to bidiWindow unanswered, this one receives the
// echoes. It returns echoes per second, until the last one arrived.
func bidiFor(ctx context.Context, cl grpc_testing.BenchmarkServiceClient, size int, d time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d+sliceMax)
	defer cancel()
	st, err := cl.StreamingCall(ctx)
	if err != nil {
		return 0, err
	}
	req := &grpc_testing.SimpleRequest{ResponseSize: int32(size), Payload: &grpc_testing.Payload{Body: make([]byte, size)}}
	window := make(chan struct{}, bidiWindow)
	sent := make(chan error, 1)
	start := time.Now()
	go func() {
		for n := 0; n < minCalls || time.Since(start) < d; n++ {
			select {
			case window <- struct{}{}:
			case <-ctx.Done():
				sent <- ctx.Err()
				return
			}
			if err := st.Send(req); err != nil {
				sent <- err
				return
			}
		}
		sent <- st.CloseSend()
	}()
	n := 0
	for {
		resp, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			cancel() // ends the sender too
			<-sent
			return 0, err
		}
		if got := len(resp.GetPayload().GetBody()); got != size {
			cancel()
			<-sent
			return 0, fmt.Errorf("echo of %d bytes, want %d", got, size)
		}
		n++
		<-window
	}
	elapsed := time.Since(start)
	if err := <-sent; err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}
