package main

// Suite conn: byte streams between two processes, as applications use them
// (Write and Read on a net.Conn or a pipe).
//
//   - pingpong: the parent writes a message of the size, the peer reads all
//     of it into its own buffer and writes it back from there, the parent
//     reads the echo into its own buffer; half round trip.
//   - stream: the parent writes messages back to back; the peer reads each
//     into its own buffer. Bandwidth is measured in chunks (plan.bwChunks),
//     each ended by the peer's acknowledgement of its last message; the row
//     shows the median chunk, and the range of all chunks.
//
// The sockets/block ping-pong of 8 B runs in rounds interleaved with the
// floor suite's unpinned futex ping-pongs (rows pingpong/futex/unpinned and
// pingpong/futexcond/unpinned of this suite), the references of its
// targets, so that all see the same minutes of a machine whose futex
// wake-up changes severalfold with load.
//
// Every byte a reader gets is copied into its own buffer (touched), on
// every transport, and the stamps at both ends of every message (sequence
// numbers) are checked: a transport that lost, repeated or tore a message
// fails the run.
//
// Transports, in connTransports: the baselines unix (Unix stream socket,
// abstract address), tcp (loopback) and pipe (a pair of os.Pipe inherited
// by the peer); ours, through package sockets: sockets/busy and
// sockets/block (network "sandirect", an "@abstract" address, the wait
// mode set in sockets.Config), sockets/busy+shared (sockets/busy writing
// every message from a buffer of sockets.AllocBuffer, which the peer reads
// in place: sharedConn) and sockets/forcetcp (network "tcp" on
// 127.0.0.1 with Config.ForceTCP: the package's plain-TCP path, what a
// program gets from sockets.Dial to another host; both ends are checked to
// be *net.TCPConn, so it is never shared memory), and sockets/default
// (sockets.DefaultConfig(), what users get: adaptive waiting, unpinned).
// cloudwego/shmipc-go is measured by its own module, bench/shmipc, and
// merged in (shmipc.go); UCX and libfabric by their own benchmarks,
// ucx_perftest (ucx/tag, ucx/stream: ucx.go) and fi_pingpong (ofi/shm,
// ping-pong only: ofi.go), pinned as the busy-polling transports are.
// Memory per idle connection of ours closes the suite (connIdle).
//
// Issue 19's targets divide sockets/busy by the best of the peers ucx/tag,
// ucx/stream and ofi/shm at each size (peerTargets), and name it.
//
// The stream targets divide by single-core copy() of the same size
// measured in chunks between the stream's own, on the same thread
// (transport memcpy@NAME): measured minutes apart in the floor suite, a
// 16 MiB copy() moved by half.
//
// SANDIRECT_BENCH_CONN=NAME measures only the transport NAME, ours or a
// peer's (and shmipc-go and the idle memory, which have their own steps).
//
// One peer command per transport: the parent listens, the peer dials, and
// the cases follow in-band on the connection:
//
//	header   16 bytes: op (u64 LE: connOpPing, connOpStream, connOpEnd), size (u64 LE)
//	message  size bytes: stamp (u64 LE) in the first 8 and, from 16 bytes on, the last 8
//	ack      8 bytes (u64 LE): messages the peer read since the last ack
//
// A stamp is the message's sequence number in its case (1, 2, …) with
// flag bits: stampAck asks for an ack after this message, stampEnd ends the
// case.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
	"github.com/sandirect/sandirect/shm"
	"github.com/sandirect/sandirect/sockets"
)

func init() {
	register(&Suite{
		Name: "conn",
		Doc:  "net.Conn ping-pong and streaming, 8 B-16 MiB: sockets (busy, block, default, forcetcp) vs UCX, libfabric, unix, tcp, pipe, shmipc-go",
		Run:  runConn,
		Rows: connRows,
	})
	registerPeer("conn", connPeer)
	// Issue 6's targets, as ratios within one run.
	targets = append(targets,
		target{name: "sockets/busy 64B p50 / unix 64B p50",
			num: recordKey{"conn", "pingpong", "sockets/busy", 64, metricLatP50},
			den: recordKey{"conn", "pingpong", "unix", 64, metricLatP50}, limit: 1.0 / 20, atMost: true},
		// Both unpinned, measured in alternate rounds: the same conditions.
		target{name: "sockets/block 8B p50 / futex/unpinned p50 (interleaved)",
			num: recordKey{"conn", "pingpong", blockRefTransport, blockRefSize, metricLatP50},
			den: recordKey{"conn", "pingpong", "futex/unpinned", blockRefSize, metricLatP50}, limit: 1.1, atMost: true},
		// The same against a futex pair that wakes only an announced
		// sleeper, as the rings do: what the sleeping path itself adds.
		target{name: "sockets/block 8B p50 / futexcond/unpinned p50 (interleaved)",
			num: recordKey{"conn", "pingpong", blockRefTransport, blockRefSize, metricLatP50},
			den: recordKey{"conn", "pingpong", "futexcond/unpinned", blockRefSize, metricLatP50}, limit: 1.1, atMost: true},
		// And against two processes that wake each other through a pipe
		// read in the Go netpoller: what a goroutine that parks (and
		// holds no thread) costs at best.
		target{name: "sockets/block 8B p50 / pipe 8B p50 (netpoller)",
			num: recordKey{"conn", "pingpong", blockRefTransport, blockRefSize, metricLatP50},
			den: recordKey{"conn", "pingpong", "pipe", blockRefSize, metricLatP50}, limit: 1.1, atMost: true})
	// sockets/busy+shared: the same targets for writes from buffers of
	// sockets.AllocBuffer, which the peer reads in place.
	for _, mode := range []string{"sockets/busy", "sockets/block", "sockets/busy+shared"} {
		for _, size := range []int{miB, 4 * miB, 16 * miB} {
			// A stream crosses cores: the two-core pipeline of the floor
			// suite is its ceiling at the time (docs: README, streams and
			// the vCPU placement).
			ceiling := &recordKey{"floor", "stream", "pipeline/best", size, metricBW}
			targets = append(targets,
				target{name: fmt.Sprintf("%s stream %s / unix", mode, fsize(size)),
					num: recordKey{"conn", "stream", mode, size, metricBW},
					den: recordKey{"conn", "stream", "unix", size, metricBW}, limit: 3, ceiling: ceiling},
				target{name: fmt.Sprintf("%s stream %s / memcpy (interleaved)", mode, fsize(size)),
					num: recordKey{"conn", "stream", mode, size, metricBW},
					den: recordKey{"conn", "stream", copyRefTransport(mode), size, metricBW}, limit: 0.6, ceiling: ceiling})
		}
	}
	// Issue 19's targets: ours against the best of UCX and libfabric at
	// each size (rows measured side by side: pairedTransport).
	peers := []string{"ucx/tag", "ucx/stream", ofiTransport}
	keys := func(cas string, size int, metric string) []recordKey {
		var ks []recordKey
		for _, p := range peers {
			ks = append(ks, recordKey{"conn", cas, p, size, metric})
		}
		return ks
	}
	for _, size := range []int{8, 64, 4 * kiB, 64 * kiB, miB} {
		peerTargets = append(peerTargets, peerTarget{name: fmt.Sprintf("%s %s p50", peerTargetTransport, fsize(size)),
			num:   recordKey{"conn", "pingpong", peerTargetTransport, size, metricLatP50},
			peers: keys("pingpong", size, metricLatP50), limit: 1.0, atMost: true})
	}
	for _, size := range []int{64, 4 * kiB, 64 * kiB, miB, 16 * miB} {
		limit := 1.0
		if size == 16*miB {
			limit = 1.5
		}
		peerTargets = append(peerTargets, peerTarget{name: fmt.Sprintf("%s stream %s", peerTargetTransport, fsize(size)),
			num:   recordKey{"conn", "stream", peerTargetTransport, size, metricBW},
			peers: keys("stream", size, metricBW), limit: limit})
	}
	goals = append(goals, goal{name: "sockets idle connection, KiB (both ends)",
		key: recordKey{"conn", "idle", connIdleTransport, 0, metricMem}, unit: kiB, limit: 256, atMost: true})
}

// A connTransport connects the two processes. To measure another
// transport, add an entry: listen runs in the parent, dial in the peer.
type connTransport struct {
	name string
	// busy: waits by spinning. Measured with the busy-poll budgets, each
	// side on a thread of its own pinned to a CPU of its own (as a
	// busy-polling application must be deployed). The others run as an
	// ordinary Go program runs: any thread, any CPU (pinned, a blocking
	// transport pays a cross-CPU wake-up per message and, behind Go's
	// netpoller, a hand-off to the locked thread).
	busy bool
	// copyRef: its streams of copyRefSizes measure copy() between their
	// chunks, their targets' reference (copyRefTransport).
	copyRef bool
	// listen returns the parent's listener; its address goes to the peer.
	listen func(ctx context.Context, name string) (connListener, error)
	// dial connects the peer to addr.
	dial func(ctx context.Context, addr string) (io.ReadWriteCloser, error)
}

// A connListener is the parent's side of a transport before the peer dials.
type connListener interface {
	Addr() string
	Accept() (io.ReadWriteCloser, error)
	Close() error
}

var connTransports = []*connTransport{
	{name: "unix",
		listen: func(ctx context.Context, name string) (connListener, error) {
			return listenNet(ctx, "unix", connAddr(name))
		},
		dial: dialNet("unix")},
	{name: "tcp",
		listen: func(ctx context.Context, _ string) (connListener, error) {
			return listenNet(ctx, "tcp", "127.0.0.1:0")
		},
		dial: dialNet("tcp")},
	{name: "pipe", listen: listenPipe, dial: dialPipe},
	{name: "sockets/busy", busy: true, copyRef: true,
		listen: listenSockets("sandirect", shm.WaitBusyPoll, false),
		dial:   dialSockets("sandirect", shm.WaitBusyPoll, false)},
	{name: "sockets/block", copyRef: true,
		listen: listenSockets("sandirect", shm.WaitBlock, false),
		dial:   dialSockets("sandirect", shm.WaitBlock, false)},
	// sockets/busy with every message written from a buffer of
	// sockets.AllocBuffer, which the peer reads in place (sharedConn).
	{name: "sockets/busy+shared", busy: true, copyRef: true,
		listen: sharedListener(listenSockets("sandirect", shm.WaitBusyPoll, false)),
		dial:   sharedDialer(dialSockets("sandirect", shm.WaitBusyPoll, false))},
	// What users get: sockets.DefaultConfig() (adaptive waiting), run as
	// an ordinary Go program runs, unpinned.
	{name: "sockets/default",
		listen: listenSockets("sandirect", shm.WaitAdaptive, false),
		dial:   dialSockets("sandirect", shm.WaitAdaptive, false)},
	// Our TCP path, not shared memory: "tcp" to loopback with ForceTCP.
	{name: "sockets/forcetcp",
		listen: listenSockets("tcp", shm.WaitAdaptive, true),
		dial:   dialSockets("tcp", shm.WaitAdaptive, true)},
}

func lookupConnTransport(name string) *connTransport {
	for _, t := range connTransports {
		if t.name == name {
			return t
		}
	}
	return nil
}

// connAddr is a fresh abstract Unix address for the transport name.
func connAddr(name string) string {
	return fmt.Sprintf("@sandirect-bench-%d-%s", os.Getpid(), strings.ReplaceAll(name, "/", "-"))
}

// ---- net.Conn transports ----

type netListener struct{ net.Listener }

func (l netListener) Addr() string { return l.Listener.Addr().String() }

func (l netListener) Accept() (io.ReadWriteCloser, error) { return l.Listener.Accept() }

func listenNet(ctx context.Context, network, addr string) (connListener, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return netListener{l}, nil
}

func dialNet(network string) func(context.Context, string) (io.ReadWriteCloser, error) {
	return func(ctx context.Context, addr string) (io.ReadWriteCloser, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// sockets: network "sandirect" on an abstract name, which must come out as
// shared memory, or "tcp" on loopback with ForceTCP, which must come out as
// TCP: a connection of the other kind fails the transport rather than
// being measured under its name.
func socketsConfig(mode shm.WaitMode, forceTCP bool) *sockets.Config {
	cfg := sockets.DefaultConfig()
	if mode != shm.WaitAdaptive {
		cfg.Wait = shm.WaitConfig{Mode: mode}
	}
	cfg.ForceTCP = forceTCP
	return &cfg
}

// checkKind fails c unless it is of the kind the transport measures.
func checkKind(c net.Conn, tcp bool, what string) error {
	_, isTCP := c.(*net.TCPConn)
	_, isSHM := c.(*sockets.Conn)
	switch {
	case tcp && !isTCP:
		c.Close()
		return fmt.Errorf("%s a %T, not a TCP connection", what, c)
	case !tcp && !isSHM:
		c.Close()
		return fmt.Errorf("%s a %T, not a shared-memory connection", what, c)
	}
	return nil
}

type socketsListener struct {
	net.Listener
	addr string
	tcp  bool // accept TCP connections only (else shared memory only)
}

func (l socketsListener) Addr() string { return l.addr }

func (l socketsListener) Accept() (io.ReadWriteCloser, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := checkKind(c, l.tcp, "accepted"); err != nil {
		return nil, err
	}
	return c, nil
}

func listenSockets(network string, mode shm.WaitMode, forceTCP bool) func(context.Context, string) (connListener, error) {
	return func(ctx context.Context, name string) (connListener, error) {
		lc := sockets.ListenConfig{Config: socketsConfig(mode, forceTCP)}
		addr := connAddr(name)
		if network == "tcp" {
			addr = "127.0.0.1:0"
		}
		l, err := lc.Listen(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return socketsListener{l, l.Addr().String(), forceTCP}, nil
	}
}

func dialSockets(network string, mode shm.WaitMode, forceTCP bool) func(context.Context, string) (io.ReadWriteCloser, error) {
	return func(ctx context.Context, addr string) (io.ReadWriteCloser, error) {
		d := sockets.Dialer{Config: socketsConfig(mode, forceTCP)}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := checkKind(c, forceTCP, fmt.Sprintf("dial %s %s gave", network, addr)); err != nil {
			return nil, err
		}
		return c, nil
	}
}

// sharedConn is a connection of ours whose messages are written from
// buffers of sockets.AllocBuffer (transport sockets/busy+shared): shared
// memory the peer maps, so that a large write is read in place, one copy
// in all, instead of being copied through temporary memory or read with
// process_vm_readv.
type sharedConn struct {
	net.Conn
	bufs map[int][]byte // by size: one per case's message size
}

// message returns a size-byte buffer of c's to write messages from.
func (c *sharedConn) message(size int) ([]byte, error) {
	if b := c.bufs[size]; b != nil {
		return b, nil
	}
	b, err := sockets.AllocBuffer(c.Conn, size)
	if err != nil {
		return nil, err
	}
	if c.bufs == nil {
		c.bufs = map[int][]byte{}
	}
	c.bufs[size] = b
	return b, nil
}

func (c *sharedConn) Close() error {
	err := c.Conn.Close()
	for _, b := range c.bufs {
		err = errors.Join(err, sockets.FreeBuffer(b))
	}
	c.bufs = nil
	return err
}

func sharedListener(listen func(context.Context, string) (connListener, error)) func(context.Context, string) (connListener, error) {
	return func(ctx context.Context, name string) (connListener, error) {
		l, err := listen(ctx, name)
		if err != nil {
			return nil, err
		}
		return sharedConnListener{l}, nil
	}
}

type sharedConnListener struct{ connListener }

func (l sharedConnListener) Accept() (io.ReadWriteCloser, error) {
	c, err := l.connListener.Accept()
	if err != nil {
		return nil, err
	}
	return &sharedConn{Conn: c.(net.Conn)}, nil
}

func sharedDialer(dial func(context.Context, string) (io.ReadWriteCloser, error)) func(context.Context, string) (io.ReadWriteCloser, error) {
	return func(ctx context.Context, addr string) (io.ReadWriteCloser, error) {
		c, err := dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		return &sharedConn{Conn: c.(net.Conn)}, nil
	}
}

// messageFor returns a size-byte message to write on c, filled with a
// pattern: from c's shared buffers if it has them.
func messageFor(c io.ReadWriter, size int) ([]byte, error) {
	sc, ok := c.(*sharedConn)
	if !ok {
		return newMessage(size), nil
	}
	b, err := sc.message(size)
	if err != nil {
		return nil, fmt.Errorf("shared buffer: %w", err)
	}
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b, nil
}

// ---- pipes ----

// The pipe transport: two pipes made for each peer process; the peer
// inherits its ends as fds firstSegFd (parent → peer, read end) and
// firstSegFd+1 (peer → parent, write end). Pipes have the default 64 KiB
// capacity: what a program gets.
type connPipes struct {
	r, w *os.File // the parent's ends: peer → parent read, parent → peer write
}

// pipeConn is one end of the two pipes as a byte stream.
type pipeConn struct{ r, w *os.File }

func (c pipeConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c pipeConn) Write(b []byte) (int, error) { return c.w.Write(b) }
func (c pipeConn) Close() error                { return errors.Join(c.r.Close(), c.w.Close()) }

// makePipes returns the parent's ends and the peer's (to be inherited).
func makePipes() (mine *connPipes, theirs []*os.File, err error) {
	toPeerR, toPeerW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	fromPeerR, fromPeerW, err := os.Pipe()
	if err != nil {
		toPeerR.Close()
		toPeerW.Close()
		return nil, nil, err
	}
	return &connPipes{r: fromPeerR, w: toPeerW}, []*os.File{toPeerR, fromPeerW}, nil
}

// curPipes are the parent's ends for the running peer; used once.
var (
	curPipesMu sync.Mutex // guards curPipes
	curPipes   *connPipes
)

type pipeListener struct{ p *connPipes }

func (l pipeListener) Addr() string { return "" }

func (l pipeListener) Accept() (io.ReadWriteCloser, error) {
	if l.p == nil {
		return nil, errors.New("the pipes of this peer were used already")
	}
	return pipeConn{l.p.r, l.p.w}, nil
}

func (l pipeListener) Close() error { return nil }

func listenPipe(context.Context, string) (connListener, error) {
	curPipesMu.Lock()
	defer curPipesMu.Unlock()
	l := pipeListener{curPipes}
	curPipes = nil
	return l, nil
}

func dialPipe(context.Context, string) (io.ReadWriteCloser, error) {
	// Inherited fds come in blocking mode (os/exec hands them over through
	// File.Fd, which clears O_NONBLOCK): a read on one would block a
	// thread and be woken directly, not wait in the netpoller as the
	// parent's ends and every goroutine's socket do. Non-blocking, they
	// go into this process's netpoller too (os.NewFile looks).
	for _, fd := range []int{firstSegFd, firstSegFd + 1} {
		if err := syscall.SetNonblock(fd, true); err != nil {
			return nil, fmt.Errorf("inherited pipe %d: %w", fd, err)
		}
	}
	r, w := os.NewFile(firstSegFd, "pipe-in"), os.NewFile(firstSegFd+1, "pipe-out")
	if r == nil || w == nil {
		return nil, errors.New("no inherited pipes")
	}
	return pipeConn{r, w}, nil
}

// ---- the suite ----

const (
	connOpPing uint64 = iota + 1
	connOpStream
	connOpEnd

	stampAck = 1 << 63 // the peer answers with an ack after this message
	stampEnd = 1 << 62 // the last message of the case
	stampSeq = stampEnd - 1

	connWarmBytes = 16 << 20 // streamed before the first chunk, at most
	connChunkMin  = 2        // messages in a chunk, at least
	connIdleConns = 65       // connections for the idle memory measurement: 1, then 64 measured

	// The ping-pong of blockRefTransport at blockRefSize bytes is measured
	// in blockRefRounds rounds interleaved with the unpinned futex
	// ping-pong, its target's reference.
	blockRefTransport = "sockets/block"
	blockRefSize      = 8
	blockRefRounds    = 8
)

// connIdleTransport names the idle-memory record: connections with the
// sockets/block configuration.
const connIdleTransport = "sockets/block"

func connSizes(env *Env) (ping, stream []int) {
	return env.plan.connPingSizes, env.plan.connStreamSizes
}

func connRows(env *Env) int {
	ping, stream := connSizes(env)
	ref := 0 // the interleaved futex reference
	if slices.Contains(ping, blockRefSize) {
		ref = 2
	}
	copies := 0 // the interleaved copy() references
	for _, t := range connTransports {
		for _, s := range stream {
			if t.copyRef && slices.Contains(copyRefSizes, s) {
				copies++
			}
		}
	}
	peers := ucxRows(env, "conn") + ofiRows(env)
	return (len(connTransports)+1)*(len(ping)+len(stream)) + 1 + ref + copies + peers // + shmipc, + idle memory
}

// peerChosen tells whether the conn suite measures transport name:
// SANDIRECT_BENCH_CONN=NAME measures only NAME (and shmipc-go and the idle
// memory). Other suites measure all of theirs.
func peerChosen(env *Env, name string) bool {
	only := os.Getenv("SANDIRECT_BENCH_CONN")
	return env.suite != "conn" || only == "" || only == name
}

func runConn(ctx context.Context, env *Env) (recs []Record, err error) {
	var p *peer
	defer func() {
		if p != nil {
			if cerr := p.close(); err == nil {
				err = cerr
			}
		}
		curPipesMu.Lock()
		if curPipes != nil { // not used: the pipe transport failed
			curPipes.r.Close()
			curPipes.w.Close()
			curPipes = nil
		}
		curPipesMu.Unlock()
	}()
	var ref *floorRef
	if ping, _ := connSizes(env); slices.Contains(ping, blockRefSize) {
		if ref, err = startFloorRef(env); err != nil {
			return nil, err
		}
		defer func() {
			if cerr := ref.close(); err == nil {
				err = cerr
			}
		}()
		// Every row of this suite, ours and the peers', is told where the
		// host had put the vCPUs when it ran (Result.Handoff).
		defer ref.probeRows(ctx, env)()
	}
	var failed []error
	// measure runs t's cases (those env wants), keeping the numbers of a
	// transport that fails: one failing does not hide the others'.
	measure := func(t *connTransport) error {
		if p == nil {
			if p, err = startConnPeer(env); err != nil {
				return err
			}
		}
		r, err := connMeasure(ctx, env, p, ref, t)
		recs = append(recs, r...)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			err = fmt.Errorf("%s: %w", t.name, err)
			fmt.Fprintf(env.out, "%-9s %-11s FAILED: %s\n", "", t.name, oneLine(err))
			failed = append(failed, err)
			p.close()
			p = nil
		}
		return nil
	}
	peers := []func(context.Context, *Env) ([]Record, error){runUCX, runOFI}
	paired := pairedTransport(env)
	for _, t := range connTransports {
		if err := ctx.Err(); err != nil {
			return recs, err
		}
		if !peerChosen(env, t.name) || t == paired {
			continue // one transport only (for a closer look at it); or paired below
		}
		if err := measure(t); err != nil {
			return recs, err
		}
	}
	if paired != nil {
		// Issue 19's targets divide sockets/busy by the best peer at each
		// size: each of its rows is measured next to the peers' of the
		// same case and size, seconds apart, so that both see the same
		// placement of the vCPUs (the handoff column); measured a minute
		// apart, a target could compare two placements.
		ping, stream := connSizes(env)
		for _, c := range []struct {
			cas   string
			sizes []int
		}{{"pingpong", ping}, {"stream", stream}} {
			for _, size := range c.sizes {
				env.only = &sizeCase{c.cas, size}
				if err := measure(paired); err != nil {
					env.only = nil
					return recs, err
				}
				for _, m := range peers {
					r, err := m(ctx, env)
					recs = append(recs, r...)
					if err != nil {
						if ctx.Err() != nil {
							env.only = nil
							return recs, err
						}
						failed = append(failed, err) // the next size tries again
					}
				}
			}
		}
		env.only = nil
		peers = nil
	}
	for _, measure := range append([]func(context.Context, *Env) ([]Record, error){runShmipc}, peers...) {
		r, err := measure(ctx, env)
		recs = append(recs, r...)
		if err != nil {
			if ctx.Err() != nil {
				return recs, err
			}
			failed = append(failed, err)
		}
	}
	if p == nil {
		if p, err = startConnPeer(env); err != nil {
			return recs, err
		}
	}
	r, err := connIdle(ctx, env, p)
	recs = append(recs, r...)
	if err != nil {
		failed = append(failed, fmt.Errorf("idle memory: %w", err))
	}
	return recs, errors.Join(failed...)
}

// peerTargetTransport is ours in the targets against the peers: busy
// polling, pinned, as UCX and libfabric run.
const peerTargetTransport = "sockets/busy"

// pairedTransport is the transport the peers' targets measure, when the
// run measures it and the peers: its rows are measured next to theirs.
func pairedTransport(env *Env) *connTransport {
	if os.Getenv("SANDIRECT_BENCH_CONN") != "" {
		return nil // one transport only
	}
	for _, t := range connTransports {
		if t.name == peerTargetTransport {
			return t
		}
	}
	return nil
}

func startConnPeer(env *Env) (*peer, error) {
	mine, theirs, err := makePipes()
	if err != nil {
		return nil, fmt.Errorf("pipes: %w", err)
	}
	p, err := startPeerFiles(env, "conn", theirs...)
	if err != nil {
		mine.r.Close()
		mine.w.Close()
		return nil, err
	}
	curPipesMu.Lock()
	if curPipes != nil {
		curPipes.r.Close()
		curPipes.w.Close()
	}
	curPipes = mine
	curPipesMu.Unlock()
	return p, nil
}

// connMeasure runs every case of transport t: one peer command, one
// connection.
func connMeasure(ctx context.Context, env *Env, p *peer, ref *floorRef, t *connTransport) (recs []Record, err error) {
	ln, err := t.listen(ctx, t.name)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	type accepted struct {
		c   io.ReadWriteCloser
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		acc <- accepted{c, err}
	}()

	var (
		mu      sync.Mutex // guards conn and aborted
		conn    io.ReadWriteCloser
		aborted bool
	)
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		if conn != nil {
			conn.Close()
		}
		freeMemory() // the buffers of the large sizes, before the next transport
	}()
	abort := func(error) {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		aborted = true
		if conn != nil {
			conn.Close()
		}
	}
	pingSizes, streamSizes := connSizes(env)
	pingSizes, streamSizes = env.wanted("pingpong", pingSizes), env.wanted("stream", streamSizes)
	cmd := ctlMsg{Op: "conn", Mode: t.name, Addr: ln.Addr(), Unpinned: !t.busy}
	// row measures one row on the measuring thread, pinned or not.
	row := func(f func() error) error {
		if t.busy {
			return pinned(env.cpus[0], f)
		}
		return f()
	}
	preempt := int64(0) // the rows' preempt column
	if !t.busy {
		preempt = -1 // not counted: no particular thread
	}
	defer preempted.Swap(0) // the peer's connection set-up and tear-down, no row's
	err = p.run(ctx, cmd, abort, func() error {
		var a accepted
		select {
		case a = <-acc:
		case <-time.After(readyTimeout):
			return errors.New("no connection from the peer")
		}
		if a.err != nil {
			return fmt.Errorf("accept: %w", a.err)
		}
		mu.Lock()
		conn = a.c
		stop := aborted
		mu.Unlock()
		if stop {
			return errAborted
		}
		warm, max, budget := env.plan.blockWarm, env.plan.blockMax, env.plan.blockTime
		if t.busy {
			warm, max, budget = env.plan.latWarm, env.plan.latMax, env.plan.latTime
		}
		smp := newSampler(max)
		for _, size := range pingSizes {
			if err := ctx.Err(); err != nil {
				return err
			}
			smp.start(0)
			hand := env.probeHandoff()
			if ref != nil && t.name == blockRefTransport && size == blockRefSize {
				// In rounds, each followed by a round of the raw futex
				// ping-pong between two other processes, so that the
				// target's ratio compares the same minutes (the futex
				// round trip on this VM changes severalfold with load).
				// The second reference wakes only an announced sleeper,
				// as our rings do (see floorWords).
				rsmp, csmp := newSampler(max), newSampler(max)
				rsmp.start(0)
				csmp.start(0)
				b, l := budget/blockRefRounds, max/blockRefRounds
				for range blockRefRounds {
					if err := connPingPong(a.c, size, warm/blockRefRounds, b, l, smp); err != nil {
						return fmt.Errorf("pingpong %s: %w", fsize(size), err)
					}
					if err := futexRounds(ctx, env, ref.p, ref.w, false, false, warm/blockRefRounds, b, l, rsmp); err != nil {
						return fmt.Errorf("reference futex ping-pong: %w", err)
					}
					if err := futexRounds(ctx, env, ref.p, ref.w, false, true, warm/blockRefRounds, b, l, csmp); err != nil {
						return fmt.Errorf("reference futex ping-pong (cond): %w", err)
					}
				}
				for _, r := range []struct {
					name string
					smp  *sampler
				}{{futexTransport(false, false), rsmp}, {futexTransport(false, true), csmp}} {
					recs = append(recs, env.Report(Result{Case: "pingpong", Transport: r.name, Size: size,
						Lat: summarize(r.smp.result()), Preempted: -1})...)
				}
			} else if err := row(func() error { return connPingPong(a.c, size, warm, budget, max, smp) }); err != nil {
				return fmt.Errorf("pingpong %s: %w", fsize(size), err)
			}
			recs = append(recs, env.Report(Result{Case: "pingpong", Transport: t.name, Size: size,
				Lat: summarize(smp.result()), Preempted: preempt, Handoff: hand})...)
		}
		for _, size := range streamSizes {
			if err := ctx.Err(); err != nil {
				return err
			}
			var bw, refBW bwSpread
			var ref func(time.Duration) float64
			if t.copyRef && slices.Contains(copyRefSizes, size) {
				// The target's reference, single-core copy() of the same
				// size, in chunks between the stream's on this thread:
				// measured apart (the floor suite), a 16 MiB copy() moved
				// by half between minutes here.
				src, dst := newMessage(size), newMessage(size)
				ref = func(d time.Duration) float64 { return copyFor(d, dst, src) }
			}
			hand := env.probeHandoff()
			err := row(func() (err error) {
				bw, refBW, err = connStream(a.c, size, env.plan.bwTime, env.plan.bwChunks, ref)
				return err
			})
			if err != nil {
				return fmt.Errorf("stream %s: %w", fsize(size), err)
			}
			recs = append(recs, env.Report(Result{Case: "stream", Transport: t.name, Size: size, HasBW: true,
				BW: bw.P50, BWMin: bw.Min, BWMax: bw.Max, Rate: bw.P50 * 1e3 / float64(size), Preempted: preempt, Handoff: hand})...)
			if ref != nil {
				recs = append(recs, env.Report(Result{Case: "stream", Transport: copyRefTransport(t.name), Size: size, HasBW: true,
					BW: refBW.P50, BWMin: refBW.Min, BWMax: refBW.Max, Rate: refBW.P50 * 1e3 / float64(size), Preempted: -1})...)
			}
		}
		return writeHeader(a.c, connOpEnd, 0)
	})
	return recs, err
}

// freeMemory returns freed heap to the system now, not through the
// background scavenger while later measurements run.
func freeMemory() { debug.FreeOSMemory() }

func putStamp(b []byte, s uint64) {
	binary.LittleEndian.PutUint64(b, s)
	if len(b) >= 16 {
		binary.LittleEndian.PutUint64(b[len(b)-8:], s)
	}
}

// getStamp returns the stamp of message b, checking that both ends agree.
func getStamp(b []byte) (uint64, error) {
	s := binary.LittleEndian.Uint64(b)
	if len(b) >= 16 {
		if e := binary.LittleEndian.Uint64(b[len(b)-8:]); e != s {
			return 0, fmt.Errorf("torn message of %d bytes: stamp %#x at the start, %#x at the end", len(b), s, e)
		}
	}
	return s, nil
}

func writeHeader(w io.Writer, op uint64, size int) error {
	var hdr [16]byte
	binary.LittleEndian.PutUint64(hdr[:], op)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(size))
	_, err := w.Write(hdr[:])
	return err
}

func newMessage(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// connPingPong measures round trips of size-byte messages, adding them to
// smp's samples (start it first): warm round trips first (at most a quarter
// of budget), then budget or laps round trips.
func connPingPong(c io.ReadWriter, size, warm int, budget time.Duration, laps int, smp *sampler) error {
	if err := writeHeader(c, connOpPing, size); err != nil {
		return err
	}
	out, err := messageFor(c, size)
	if err != nil {
		return err
	}
	in := make([]byte, size)
	seq := uint64(0)
	rt := func(flags uint64) error {
		seq++
		putStamp(out, seq|flags)
		if _, err := c.Write(out); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return err
		}
		s, err := getStamp(in)
		if err != nil {
			return err
		}
		if s != seq|flags {
			return fmt.Errorf("echo stamp %#x, want %#x", s, seq|flags)
		}
		return nil
	}
	warmEnd := time.Now().Add(budget / 4)
	for i := 0; i < warm && (i%64 != 0 || time.Now().Before(warmEnd)); i++ {
		if err := rt(0); err != nil {
			return err
		}
	}
	smp.resume(budget, laps)
	for {
		if err := rt(0); err != nil {
			return err
		}
		if !smp.lap() {
			break
		}
	}
	if err := rt(stampEnd); err != nil {
		return err
	}
	return peerPreemptions(c)
}

// peerPreemptions reads what the peer says after each case: how often its
// measuring thread was preempted meanwhile (^0: not counted).
func peerPreemptions(c io.Reader) error {
	var b [8]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fmt.Errorf("peer's preemptions: %w", err)
	}
	if n := binary.LittleEndian.Uint64(b[:]); n != ^uint64(0) {
		preempted.Add(int64(n))
	}
	return nil
}

// bwSpread is a bandwidth measured in chunks: the slowest, the median and
// the fastest chunk, GB/s.
type bwSpread struct{ Min, P50, Max float64 }

func spreadOf(gbps []float64) bwSpread {
	slices.Sort(gbps)
	if len(gbps) == 0 {
		return bwSpread{}
	}
	return bwSpread{Min: gbps[0], P50: gbps[(len(gbps)-1)/2], Max: gbps[len(gbps)-1]}
}

// connStream streams size-byte messages: a warm-up chunk, then chunks
// chunks of about total/chunks each, every chunk ended by the peer's ack.
//
// With ref set, each chunk after the warm-up is followed by ref for as
// long, whose spread it returns too: a reference measured in the same
// minutes.
func connStream(c io.ReadWriter, size int, total time.Duration, chunks int, ref func(time.Duration) float64) (bw, refBW bwSpread, err error) {
	if err := writeHeader(c, connOpStream, size); err != nil {
		return bwSpread{}, bwSpread{}, err
	}
	out, err := messageFor(c, size)
	if err != nil {
		return bwSpread{}, bwSpread{}, err
	}
	var ack [8]byte
	seq := uint64(0)
	// Look at the clock about every 64 KiB written.
	check := max(1, 64<<10/size)
	chunk := func(d time.Duration, minMsgs int, flags uint64) (float64, error) {
		start := time.Now()
		n := 0
		for {
			n++
			seq++
			s := seq
			last := n >= minMsgs && (n%check == 0 || n == minMsgs) && time.Since(start) >= d
			if last {
				s |= stampAck | flags
			}
			putStamp(out, s)
			if _, err := c.Write(out); err != nil {
				return 0, err
			}
			if last {
				break
			}
		}
		if _, err := io.ReadFull(c, ack[:]); err != nil {
			return 0, fmt.Errorf("ack: %w", err)
		}
		if got := binary.LittleEndian.Uint64(ack[:]); got != uint64(n) {
			return 0, fmt.Errorf("peer acknowledged %d messages, %d were sent", got, n)
		}
		gbps, _ := throughput(size, int64(n), time.Since(start))
		return gbps, nil
	}
	per := total / time.Duration(max(1, chunks))
	warmMsgs := max(connChunkMin, min(connWarmBytes/size, 1000))
	if _, err := chunk(per/2, warmMsgs, 0); err != nil {
		return bwSpread{}, bwSpread{}, fmt.Errorf("warm-up: %w", err)
	}
	var gbps, refs []float64
	for i := range chunks {
		var flags uint64
		if i == chunks-1 {
			flags = stampEnd
		}
		bw, err := chunk(per, connChunkMin, flags)
		if err != nil {
			return bwSpread{}, bwSpread{}, err
		}
		gbps = append(gbps, bw)
		if ref != nil {
			refs = append(refs, ref(per))
		}
	}
	if ref != nil {
		refBW = spreadOf(refs)
	}
	return spreadOf(gbps), refBW, peerPreemptions(c)
}

// copyRefSizes are the stream sizes whose targets divide by copy():
// streams of ours at these sizes measure it in the same minutes.
var copyRefSizes = []int{miB, 4 * miB, 16 * miB}

// copyRefTransport is the name of the copy() reference measured with
// transport t's streams.
func copyRefTransport(t string) string { return "memcpy@" + t }

// isReference tells whether a conn row is an interleaved reference rather
// than a transport: left out of the side-by-side table and drawn apart.
func isReference(transport string) bool {
	return floorTransports[transport] || strings.HasPrefix(transport, "memcpy@")
}

// connPeer serves one connection per command.
func connPeer(pc *peerConn) error {
	return pc.serve(func(cmd ctlMsg) error {
		switch cmd.Op {
		case "conn":
			t := lookupConnTransport(cmd.Mode)
			if t == nil {
				return fmt.Errorf("unknown transport %q", cmd.Mode)
			}
			ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
			c, err := t.dial(ctx, cmd.Addr)
			cancel()
			if err != nil {
				return fmt.Errorf("dial %s: %w", t.name, err)
			}
			defer freeMemory()
			defer c.Close()
			if err := pc.ready(); err != nil {
				return err
			}
			return connServe(c, !cmd.Unpinned)
		case "idle":
			return idlePeer(pc, cmd)
		}
		return fmt.Errorf("unknown command %q", cmd.Op)
	})
}

// connServe follows the parent's cases on c until connOpEnd. After each
// case it tells the parent how often its thread was preempted meanwhile,
// if it runs on a thread of its own (counted), and takes that count out
// of what the command's "done" reports.
func connServe(c io.ReadWriter, counted bool) error {
	var hdr [16]byte
	for {
		var before int64
		if counted {
			before, _ = sys.ThreadPreemptions()
		}
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return fmt.Errorf("header: %w", err)
		}
		op, size := binary.LittleEndian.Uint64(hdr[:]), binary.LittleEndian.Uint64(hdr[8:])
		if op == connOpEnd {
			return nil
		}
		if size < 8 || size > 1<<30 {
			return fmt.Errorf("message size %d", size)
		}
		// The answer goes out of a buffer of its own, as ucx_perftest's
		// and fi_pingpong's responders send theirs: the bytes just
		// received are not sent back from where they landed, which
		// would have the other side read lines this core has just
		// written (docs/peers.md, "The responder's buffers").
		buf := make([]byte, size)
		out, err := messageFor(c, int(size))
		if err != nil {
			return err
		}
		var ack [8]byte
		n := uint64(0)
		for seq := uint64(1); ; seq++ {
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
			s, err := getStamp(buf)
			if err != nil {
				return err
			}
			if s&stampSeq != seq {
				return fmt.Errorf("message %d arrived as number %d", seq, s&stampSeq)
			}
			switch op {
			case connOpPing:
				putStamp(out, s) // the echo: the stamp, both ends
				if _, err := c.Write(out); err != nil {
					return err
				}
			case connOpStream:
				n++
				if s&stampAck != 0 {
					binary.LittleEndian.PutUint64(ack[:], n)
					n = 0
					if _, err := c.Write(ack[:]); err != nil {
						return err
					}
				}
			default:
				return fmt.Errorf("unknown op %d", op)
			}
			if s&stampEnd != 0 {
				break
			}
		}
		pre := ^uint64(0)
		if counted {
			if after, err := sys.ThreadPreemptions(); err == nil && after >= before {
				pre = uint64(after - before)
				preempted.Add(before - after)
			}
		}
		if _, err := c.Write(binary.LittleEndian.AppendUint64(nil, pre)); err != nil {
			return err
		}
	}
}

// ---- memory per idle connection ----

// connIdle opens connIdleConns idle connections of ours between the two
// processes and reports what each costs: the growth of both processes'
// proportional set size (Pss: shared segments counted once) divided by the
// number of connections. The first connection is made before the first
// measurement, so that what every process pays once (the device, the
// connection manager, the eBPF monitor's load: settleMemory) is not
// counted.
func connIdle(ctx context.Context, env *Env, p *peer) ([]Record, error) {
	lc := sockets.ListenConfig{Config: socketsConfig(shm.WaitBlock, false)}
	ln, err := lc.Listen(ctx, "sandirect", connAddr("idle"))
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	freeMemory()
	var conns []net.Conn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
		conns = nil
	}
	defer closeAll()
	var before, after int64
	cmd := ctlMsg{Op: "idle", Addr: ln.Addr().String(), Size: connIdleConns}
	err = p.run(ctx, cmd, func(error) { ln.Close() }, func() error {
		defer closeAll() // the peer waits for that before it answers
		var b [1]byte
		for i := range connIdleConns {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			conns = append(conns, c)
			if i == 0 {
				// Both processes measured with their eBPF monitors
				// loaded (in the background, from the first connection
				// on) and the load's garbage given back: a process's
				// once, not a connection's. The peer says when it is.
				settleMemory(c)
				if _, err := io.ReadFull(c, b[:]); err != nil {
					return fmt.Errorf("peer settled: %w", err)
				}
				if before, err = pssPair(p); err != nil {
					return err
				}
				// Go on.
				if _, err := c.Write(b[:]); err != nil {
					return err
				}
			}
		}
		// The peer writes a byte on its first connection once every dial
		// has returned. (Not on its last: handshakes run concurrently, and
		// with early dials the listener accepts in any order.)
		if _, err := io.ReadFull(conns[0], b[:]); err != nil {
			return err
		}
		freeMemory()
		after, err = pssPair(p)
		return err
	})
	if err != nil {
		return nil, err
	}
	per := float64(after-before) / (connIdleConns - 1)
	fmt.Fprintf(env.out, "%-9s %-13s %d connections: %s KiB each (both ends, growth of Pss)\n",
		"idle", connIdleTransport, connIdleConns-1, fnum(per/kiB))
	env.step("")
	return []Record{{Suite: env.suite, Case: "idle", Transport: connIdleTransport, Metric: metricMem, Value: per}}, nil
}

// settleMemory waits for the registration monitor of c's device, whose
// eBPF programs load in the background from a process's first
// connection, and gives the heap the load left behind back to the
// system, so that a measurement of memory after it counts connections,
// not the load.
func settleMemory(c net.Conn) {
	if sc, ok := c.(*sockets.Conn); ok {
		sc.Monitor()
	}
	freeMemory()
}

// idlePeer dials cmd.Size connections to cmd.Addr: the first, on which
// it writes a byte once settled (settleMemory), then (when the parent has
// measured and says so on it) the others; it writes a byte on the first
// once every dial has returned, and waits until the parent closes it.
func idlePeer(pc *peerConn, cmd ctlMsg) error {
	freeMemory() // a collection, then the heap's free pages back
	if err := pc.ready(); err != nil {
		return err
	}
	if cmd.Size < 2 {
		return fmt.Errorf("%d connections", cmd.Size)
	}
	d := sockets.Dialer{Config: socketsConfig(shm.WaitBlock, false)}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var b [1]byte
	for i := range cmd.Size {
		c, err := d.Dial("sandirect", cmd.Addr)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		if i == 0 {
			settleMemory(c)
			if _, err := c.Write(b[:]); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, b[:]); err != nil {
				return fmt.Errorf("go-ahead: %w", err)
			}
		}
	}
	freeMemory()
	first := conns[0]
	if _, err := first.Write(b[:]); err != nil {
		return err
	}
	if _, err := first.Read(b[:]); err != io.EOF {
		return fmt.Errorf("read after the last byte: %v, want EOF", err)
	}
	return nil
}

// pssPair is the proportional set size of this process and the peer, bytes.
func pssPair(p *peer) (int64, error) {
	a, err := sys.Pss("self")
	if err != nil {
		return 0, err
	}
	b, err := sys.Pss(strconv.Itoa(p.cmd.Process.Pid))
	return a + b, err
}
