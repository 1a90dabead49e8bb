package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// httpClients holds one http.Client per transport for the whole run, its
// keep-alive pool large enough for every concurrent client.
type httpClients struct {
	transports []*http.Transport
	clients    map[string]*http.Client
}

func newHTTPClients(a serverAddrs) *httpClients {
	h := &httpClients{clients: map[string]*http.Client{}}
	for _, t := range transports {
		addr, dial := a.HTTP[t.name], t.dial
		tr := &http.Transport{
			DialContext:  func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, addr) },
			MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true,
		}
		h.transports = append(h.transports, tr)
		h.clients[t.name] = &http.Client{Transport: tr}
	}
	return h
}

func (h *httpClients) close() {
	for _, tr := range h.transports {
		tr.CloseIdleConnections()
	}
}

// measureHTTP interleaves the transports' GETs, body size by size and
// client count by client count.
func measureHTTP(ctx context.Context, w *rowWriter, o options, h *httpClients) error {
	for _, size := range o.httpSizes {
		for _, clients := range o.clients {
			err := measureRate(ctx, w, o, "get-c"+strconv.Itoa(clients), "http", size, func(t transport, d time.Duration) (float64, error) {
				return getFor(ctx, h.clients[t.name], size, clients, d)
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// getFor runs clients goroutines that GET a body of size one after the
// other for d (each at least once) and returns requests per second, until
// the last one finished.
func getFor(ctx context.Context, cl *http.Client, size, clients int, d time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d+sliceMax)
	defer cancel()
	url := "http://app/get?size=" + strconv.Itoa(size)
	var (
		done  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			// One request per client, used again once its body is closed.
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				once.Do(func() { first = err; cancel() })
				return
			}
			for n := 0; n < 1 || time.Since(start) < d; n++ {
				if err := get(cl, req, size); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return 0, first
	}
	return float64(done.Load()) / elapsed.Seconds(), nil
}

// get makes one request and reads its whole body, as a client does.
func get(cl *http.Client, req *http.Request, size int) error {
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return fmt.Errorf("read body: %w", err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("status %s", resp.Status)
	case n != int64(size):
		return fmt.Errorf("body of %d bytes, want %d", n, size)
	}
	return nil
}
