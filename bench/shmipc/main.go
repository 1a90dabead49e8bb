// Command shmipc measures cloudwego/shmipc-go between two processes the way
// sandirect's bench measures its conn transports, and writes the numbers as
// records of the bench's JSON schema (suite "conn", transport "shmipc").
// It is a module of its own so that shmipc-go and its dependencies stay out
// of sandirect's; the bench builds and runs it with the conn suite.
//
//	go run . [-ping SIZES] [-stream SIZES] [-lat-time D] [-lat-max N] [-warm N] [-bw-time D] [-chunks N] [-records FILE]
//
// Cases, as in the conn suite (bench/conn.go), with the same in-band
// framing and stamps:
//
//   - pingpong: this process writes a message of the size on a stream, the
//     server process reads it (copying every byte out of shared memory into
//     its own buffer) and writes it back; half round trip.
//   - stream: this process writes messages back to back; the server copies
//     each one into its own buffer. Chunks of -bw-time/-chunks, each ended
//     by the server's ack; the median chunk and the range. shmipc-go has
//     no flow control of its own, so the stream has one: a window of half
//     the shared memory, credits returned by the server (see streamBW).
//
// shmipc-go is used as its README and examples say: a session per
// connection over a Unix socket with memfd shared memory, the client
// through a SessionManager; writes with BufferWriter.WriteBytes and
// Stream.Flush, reads with BufferReader.ReadBytes and ReleasePreviousRead.
// Every (case, size) gets a session of its own, its buffer slices sized for
// the message as shmipc-go's own benchmark does. Records go out as one JSON
// array per row and line, to -records (default standard output; shmipc-go
// logs its errors to standard output too).
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cloudwego/shmipc-go"
)

const (
	envRole      = "SANDIRECT_SHMIPC_ROLE" // "server" in the child
	listenerFd   = 3                       // the child's inherited listener
	logLevelErrs = 4                       // shmipc-go's levelError

	opPing   uint64 = 1
	opStream uint64 = 2

	stampAck   = 1 << 63
	wordCredit = 1 << 63 // server to client: credits (low bits), else an ack
	stampEnd   = 1 << 62
	stampSeq   = stampEnd - 1

	chunkMin    = 2
	warmBytes   = 16 << 20
	initTimeout = 30 * time.Second // session set-up: its default, 1 s, is too short for 256 MiB on a busy machine
)

// Record is one number, in the bench's schema.
type Record struct {
	Suite     string  `json:"suite"`
	Case      string  `json:"case"`
	Transport string  `json:"transport"`
	Size      int     `json:"size"`
	Metric    string  `json:"metric"`
	Value     float64 `json:"value"`
}

func main() {
	shmipc.SetLogLevel(logLevelErrs)
	if os.Getenv(envRole) == "server" {
		if err := serve(); err != nil {
			fmt.Fprintln(os.Stderr, "shmipc bench server:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "shmipc bench:", err)
		os.Exit(1)
	}
}

type options struct {
	ping, stream []int
	latTime      time.Duration
	latMax       int
	warm         int
	bwTime       time.Duration
	chunks       int
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 8 || n > 1<<30 {
			return nil, fmt.Errorf("size %q: want 8 to 1 GiB bytes", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(args []string) error {
	fs := flag.NewFlagSet("shmipc", flag.ContinueOnError)
	ping := fs.String("ping", "8,64,4096,65536,1048576", "ping-pong message `SIZES` in bytes, comma-separated")
	stream := fs.String("stream", "64,4096,65536,1048576,16777216", "streaming message `SIZES` in bytes")
	var o options
	fs.DurationVar(&o.latTime, "lat-time", 400*time.Millisecond, "ping-pong time per size")
	fs.IntVar(&o.latMax, "lat-max", 50_000, "at most this many timed round trips per size")
	fs.IntVar(&o.warm, "warm", 100, "round trips before timing, at least (and enough to use all shared memory once)")
	fs.DurationVar(&o.bwTime, "bw-time", 200*time.Millisecond, "streaming time per size")
	fs.IntVar(&o.chunks, "chunks", 3, "streaming chunks per size (the spread)")
	records := fs.String("records", "-", "write the records to `FILE`, one JSON array per row and line; -: standard output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if o.ping, err = parseSizes(*ping); err != nil {
		return err
	}
	if o.stream, err = parseSizes(*stream); err != nil {
		return err
	}
	if o.chunks < 1 || o.latMax < 1 {
		return errors.New("-chunks and -lat-max must be positive")
	}
	out := io.Writer(os.Stdout)
	if *records != "-" {
		f, err := os.OpenFile(*records, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}

	addr := fmt.Sprintf("@sandirect-shmipc-%d", os.Getpid())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return err
	}
	defer ln.Close()
	srv, err := startServer(ln)
	if err != nil {
		return err
	}
	defer srv.cmd.Process.Kill()

	emit := func(recs []Record) error {
		b, err := json.Marshal(recs)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", b)
		return err
	}
	smp := make([]int64, o.latMax)
	for _, size := range o.ping {
		lat, err := withStream(addr, size, false, func(st *shmipc.Stream) ([]int64, error) {
			return pingPong(st, size, o, smp)
		})
		if err != nil {
			return fmt.Errorf("pingpong %d B: %w", size, err)
		}
		l := summarize(lat)
		if err := flushNotes(out); err != nil {
			return err
		}
		if err := emit([]Record{
			rec("pingpong", size, "lat_min_ns", l[0]), rec("pingpong", size, "lat_p50_ns", l[1]),
			rec("pingpong", size, "lat_p99_ns", l[2]), rec("pingpong", size, "lat_p999_ns", l[3]),
		}); err != nil {
			return err
		}
	}
	for _, size := range o.stream {
		var gbps []float64
		_, err := withStream(addr, size, true, func(st *shmipc.Stream) ([]int64, error) {
			var err error
			gbps, err = streamBW(st, size, o)
			return nil, err
		})
		if err != nil {
			return fmt.Errorf("stream %d B: %w", size, err)
		}
		slices.Sort(gbps)
		p50 := gbps[(len(gbps)-1)/2]
		if err := flushNotes(out); err != nil {
			return err
		}
		if err := emit([]Record{
			rec("stream", size, "bw_gbps", p50), rec("stream", size, "bw_min_gbps", gbps[0]),
			rec("stream", size, "bw_max_gbps", gbps[len(gbps)-1]), rec("stream", size, "rate_mps", p50*1e3/float64(size)),
		}); err != nil {
			return err
		}
	}
	return srv.stop()
}

// server is the server process; closing its standard input ends it.
type server struct {
	cmd   *exec.Cmd
	stdin io.Closer
}

func (s *server) stop() error {
	s.stdin.Close()
	return s.cmd.Wait()
}

func flushNotes(w io.Writer) error {
	for _, n := range notes {
		if _, err := fmt.Fprintf(w, "# %s\n", n); err != nil {
			return err
		}
	}
	notes = notes[:0]
	return nil
}

func rec(cas string, size int, metric string, v float64) Record {
	return Record{Suite: "conn", Case: cas, Transport: "shmipc", Size: size, Metric: metric, Value: v}
}

// startServer runs this program again as the server, handing it ln.
func startServer(ln *net.UnixListener) (*server, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	f, err := ln.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envRole+"=server")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &server{cmd, stdin}, nil
}

// config is shmipc-go's configuration for messages of size bytes, as its
// own benchmark sets it up: 70% of the shared memory in slices that hold
// one message, the rest in 16 KiB and 64 KiB slices; for streaming 256 MiB
// of shared memory (512 MiB for messages of 4 MiB and more), for ping-pong
// its default, 32 MiB (2 messages in flight; and hundreds of thousands of
// small slices take a second to set up). shmipc-go has no flow control
// over shared memory: a writer that finds it full falls back to the Unix
// socket (the notes count that); with its default size a stream of small
// messages does so within a second here.
func config(size int, streaming bool) *shmipc.Config {
	c := shmipc.DefaultConfig()
	c.MemMapType = shmipc.MemMapTypeMemFd
	c.LogOutput = os.Stderr
	c.QueueCap = 65535
	c.ConnectionWriteTimeout = 10 * time.Second
	c.InitializeTimeout = initTimeout
	c.ShareMemoryBufferCap = uint32(shmCap(size, streaming))
	c.BufferSliceSizes = []*shmipc.SizePercentPair{
		{Size: uint32(size) + 256, Percent: 70},
		{Size: 16 << 10, Percent: 20},
		{Size: 64 << 10, Percent: 10},
	}
	return c
}

func shmCap(size int, streaming bool) int {
	switch {
	case size >= 4<<20:
		return 512 << 20
	case streaming || size >= 1<<20:
		return 256 << 20
	}
	return 32 << 20
}

// warmMessages is how many messages of size bytes warm a session up: enough
// to go through all its shared memory twice (shmipc-go hands out its slices
// in turn: until each was used once, sends pay the page faults of fresh
// memory), at most 2000 (small messages: 15 slices share a page).
func warmMessages(size int, streaming bool) int {
	return max(chunkMin, min(2000, 2*shmCap(size, streaming)/size))
}

// withStream opens a session for messages of size bytes (its own shared
// memory: the prefix names the size), runs f on a stream and closes it.
func withStream(addr string, size int, streaming bool, f func(*shmipc.Stream) ([]int64, error)) ([]int64, error) {
	c := shmipc.DefaultSessionManagerConfig()
	c.Config = config(size, streaming)
	c.ShareMemoryPathPrefix = fmt.Sprintf("/dev/shm/sandirect-shmipc-%d-%d", os.Getpid(), size)
	c.QueuePath = c.ShareMemoryPathPrefix + "_queue"
	c.Network, c.Address = "unix", addr
	c.SessionNum = 1
	sm, err := shmipc.NewSessionManager(c)
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	defer sm.Close()
	st, err := sm.GetStream()
	if err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	defer st.Close()
	r, err := f(st)
	_, stab, _ := st.Session().GetMetrics()
	// A full queue is retried and costs little; a fallback leaves shared memory.
	if n := stab.FallbackWriteCount + stab.AllocShmErrorCount; n > 0 {
		notes = append(notes, fmt.Sprintf("%d B: %d writes fell back to the Unix socket, %d shared-memory allocations failed, %d queue-full retries",
			size, stab.FallbackWriteCount, stab.AllocShmErrorCount, stab.QueueFullErrorCount))
	}
	return r, err
}

// notes say where shmipc-go left its fast path; written as "#" lines.
var notes []string

func putStamp(b []byte, s uint64) {
	binary.LittleEndian.PutUint64(b, s)
	if len(b) >= 16 {
		binary.LittleEndian.PutUint64(b[len(b)-8:], s)
	}
}

func getStamp(b []byte) (uint64, error) {
	s := binary.LittleEndian.Uint64(b)
	if len(b) >= 16 {
		if e := binary.LittleEndian.Uint64(b[len(b)-8:]); e != s {
			return 0, fmt.Errorf("torn message of %d bytes: stamp %#x at the start, %#x at the end", len(b), s, e)
		}
	}
	return s, nil
}

// send copies b into shared memory and hands it to the peer. A full queue
// drops the buffer (Flush recycles it): write it again.
func send(st *shmipc.Stream, b []byte) error {
	for {
		if _, err := st.BufferWriter().WriteBytes(b); err != nil {
			return err
		}
		err := st.Flush(false)
		if !errors.Is(err, shmipc.ErrQueueFull) {
			return err
		}
		time.Sleep(time.Microsecond)
	}
}

// recv copies the next len(b) bytes out of shared memory into b: every
// byte touched, as every transport's reader does in the conn suite.
func recv(st *shmipc.Stream, b []byte) error {
	r := st.BufferReader()
	m, err := r.ReadBytes(len(b))
	if err != nil {
		return err
	}
	copy(b, m)
	r.ReleasePreviousRead()
	return nil
}

func header(op uint64, size int) []byte {
	h := make([]byte, 16)
	binary.LittleEndian.PutUint64(h, op)
	binary.LittleEndian.PutUint64(h[8:], uint64(size))
	return h
}

func message(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// pingPong returns full round-trip times, ns.
func pingPong(st *shmipc.Stream, size int, o options, smp []int64) ([]int64, error) {
	if err := send(st, header(opPing, size)); err != nil {
		return nil, err
	}
	out, in := message(size), make([]byte, size)
	seq := uint64(0)
	rt := func(flags uint64) error {
		seq++
		putStamp(out, seq|flags)
		if err := send(st, out); err != nil {
			return err
		}
		if err := recv(st, in); err != nil {
			return err
		}
		s, err := getStamp(in)
		if err == nil && s != seq|flags {
			err = fmt.Errorf("echo stamp %#x, want %#x", s, seq|flags)
		}
		return err
	}
	// Round trips send two messages.
	for range max(o.warm, warmMessages(size, false)/2) {
		if err := rt(0); err != nil {
			return nil, err
		}
	}
	base := time.Now()
	last := time.Since(base)
	n := 0
	for n < len(smp) && last < o.latTime {
		if err := rt(0); err != nil {
			return nil, err
		}
		now := time.Since(base)
		smp[n] = int64(now - last)
		last = now
		n++
	}
	return smp[:n], rt(stampEnd)
}

// streamBW returns the chunks' bandwidths, GB/s.
//
// shmipc-go has no flow control over its shared memory: a writer that runs
// ahead of the reader finds it full and falls back to the Unix socket, and
// a stream that fell back stays there. So the writer here keeps at most a
// window of messages unconsumed (half the slices their size has), and the
// reader returns credits, as an application streaming over shmipc-go must.
func streamBW(st *shmipc.Stream, size int, o options) ([]float64, error) {
	window := uint64(streamWindow(size))
	hdr := header(opStream, size)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(size)|window<<32)
	if err := send(st, hdr); err != nil {
		return nil, err
	}
	out := message(size)
	word := make([]byte, 8)
	var seq, credited uint64
	// next reads the server's next word: credits are counted, an ack is
	// returned.
	next := func() (uint64, bool, error) {
		if err := recv(st, word); err != nil {
			return 0, false, err
		}
		w := binary.LittleEndian.Uint64(word)
		if w&wordCredit != 0 {
			credited += w &^ wordCredit
			return 0, false, nil
		}
		return w, true, nil
	}
	check := max(1, 64<<10/size)
	chunk := func(d time.Duration, minMsgs int, flags uint64) (float64, error) {
		start := time.Now()
		n := 0
		for {
			n++
			seq++
			for seq-credited > window {
				if _, ack, err := next(); err != nil || ack {
					return 0, fmt.Errorf("waiting for credit: %v (ack %v)", err, ack)
				}
			}
			s := seq
			last := n >= minMsgs && (n%check == 0 || n == minMsgs) && time.Since(start) >= d
			if last {
				s |= stampAck | flags
			}
			putStamp(out, s)
			if err := send(st, out); err != nil {
				return 0, err
			}
			if last {
				break
			}
		}
		for {
			got, ack, err := next()
			if err != nil {
				return 0, fmt.Errorf("ack: %w", err)
			}
			if !ack {
				continue
			}
			if got != uint64(n) {
				return 0, fmt.Errorf("server acknowledged %d messages, %d were sent", got, n)
			}
			return float64(size) * float64(n) / time.Since(start).Seconds() / 1e9, nil
		}
	}
	per := o.bwTime / time.Duration(o.chunks)
	if _, err := chunk(per/2, max(warmMessages(size, true), min(warmBytes/size, 1000)), 0); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var gbps []float64
	for i := range o.chunks {
		var flags uint64
		if i == o.chunks-1 {
			flags = stampEnd
		}
		g, err := chunk(per, chunkMin, flags)
		if err != nil {
			return nil, err
		}
		gbps = append(gbps, g)
	}
	return gbps, nil
}

// streamWindow is how many messages of size bytes the writer keeps
// unconsumed: half the slices of their size.
func streamWindow(size int) int {
	return max(2, shmCap(size, true)*7/10/(size+256)/2)
}

// summarize returns min, p50, p99 and p99.9 of half round trips (nearest
// rank), ns.
func summarize(rtts []int64) [4]float64 {
	if len(rtts) == 0 {
		return [4]float64{}
	}
	slices.Sort(rtts)
	half := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(rtts))-1e-9)) - 1
		return float64(rtts[max(0, min(i, len(rtts)-1))]) / 2
	}
	return [4]float64{float64(rtts[0]) / 2, half(0.50), half(0.99), half(0.999)}
}

// ---- server ----

// serve accepts sessions, each carrying one stream and one case, until its
// standard input closes.
func serve() error {
	ln, err := net.FileListener(os.NewFile(listenerFd, "listener"))
	if err != nil {
		return err
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil // done
			}
			return err
		}
		if err := serveSession(conn); err != nil {
			return err
		}
	}
}

func serveSession(conn net.Conn) error {
	c := shmipc.DefaultConfig()
	c.MemMapType = shmipc.MemMapTypeMemFd
	c.LogOutput = os.Stderr
	c.InitializeTimeout = initTimeout
	s, err := shmipc.Server(conn, c)
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	defer s.Close()
	st, err := s.AcceptStream()
	if err != nil {
		return fmt.Errorf("accept stream: %w", err)
	}
	defer st.Close()
	hdr := make([]byte, 16)
	if err := recv(st, hdr); err != nil {
		return fmt.Errorf("header: %w", err)
	}
	op, size := binary.LittleEndian.Uint64(hdr), binary.LittleEndian.Uint64(hdr[8:])&(1<<32-1)
	window := binary.LittleEndian.Uint64(hdr[8:]) >> 32 // stream: credits go back at half of it
	if size < 8 || size > 1<<30 {
		return fmt.Errorf("message size %d", size)
	}
	buf := make([]byte, size)
	ack := make([]byte, 8)
	n, consumed := uint64(0), uint64(0)
	for seq := uint64(1); ; seq++ {
		if err := recv(st, buf); err != nil {
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
		case opPing:
			if err := send(st, buf); err != nil {
				return err
			}
		case opStream:
			n++
			consumed++
			if consumed >= max(1, window/2) {
				binary.LittleEndian.PutUint64(ack, consumed|wordCredit)
				consumed = 0
				if err := send(st, ack); err != nil {
					return err
				}
			}
			if s&stampAck != 0 {
				binary.LittleEndian.PutUint64(ack, n)
				n = 0
				if err := send(st, ack); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("unknown op %d", op)
		}
		if s&stampEnd != 0 {
			return nil
		}
	}
}
