package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/testutil"
	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/pin"
)

func TestMain(m *testing.M) {
	// "server": run in a second process; what it prints goes to the test's
	// pipe on fd 3 too, so the test can wait for its "listening" line.
	testutil.RegisterChild("server", func(args []string) error {
		out := os.NewFile(3, "out")
		defer out.Close()
		return run(context.Background(), io.MultiWriter(os.Stdout, out), args)
	})
	// "main": the command itself, exit status and stderr included.
	testutil.RegisterChild("main", func(args []string) error {
		os.Args = append([]string{"sdperf"}, args...)
		main()
		return nil
	})
	testutil.Main(m, pin.CloseIdleMonitors) // the devices' idle eBPF monitor (pin.SetIdleMonitorLinger)
}

var addrSeq atomic.Int64

// server is an sdperf server in a child process.
type server struct {
	child *testutil.Child
	addr  string

	mu      sync.Mutex // guards out, changed
	out     bytes.Buffer
	changed chan struct{} // closed and replaced when out grows
	eof     chan struct{} // closed when the child's output pipe is drained
}

// startServer starts `sdperf args… -addr @unique` in a child process and
// returns once it prints that it listens.
func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	s := &server{
		addr:    fmt.Sprintf("@sdperf-test-%d-%d", os.Getpid(), addrSeq.Add(1)),
		changed: make(chan struct{}),
		eof:     make(chan struct{}),
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.child = testutil.StartChild(t, "server", []*os.File{w}, append(slices.Clone(args), "-addr", s.addr)...)
	w.Close()
	go func() {
		defer close(s.eof)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			s.mu.Lock()
			s.out.WriteString(sc.Text() + "\n")
			close(s.changed)
			s.changed = make(chan struct{})
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { s.child.Kill(); <-s.eof })
	s.waitFor(t, "listening on "+s.addr)
	return s
}

// waitFor returns once the server has printed text.
func (s *server) waitFor(t *testing.T, text string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		s.mu.Lock()
		found, changed := strings.Contains(s.out.String(), text), s.changed
		s.mu.Unlock()
		if found {
			return
		}
		select {
		case <-changed:
		case <-s.eof:
			t.Fatalf("server exited before printing %q: %v", text, s.child.Wait(time.Second))
		case <-timeout:
			t.Fatalf("server did not print %q in 30 s:\n%s", text, s.child.Output())
		}
	}
}

// wait waits for the server to exit and returns what it printed on stdout
// and its error (with its output).
func (s *server) wait() (string, error) {
	err := s.child.Wait(60 * time.Second)
	<-s.eof
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String(), err
}

// client runs the client in this process.
func client(t *testing.T, s *server, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out, append(slices.Clone(args), s.addr))
	return out.String(), err
}

// table returns the rows of the result table in out, split in fields,
// after checking the header line is perftest's.
func table(t *testing.T, out string, lat bool) [][]string {
	t.Helper()
	header := strings.TrimSuffix(resultFmtBW, "\n")
	if lat {
		header = strings.TrimSuffix(resultFmtLat, "\n")
	}
	lines := strings.Split(out, "\n")
	i := slices.Index(lines, header)
	if i < 0 {
		t.Fatalf("no perftest header %q in output:\n%s", header, out)
	}
	var rows [][]string
	for _, l := range lines[i+1:] {
		if l+"\n" == resultLine {
			return rows
		}
		rows = append(rows, strings.Fields(l))
	}
	t.Fatalf("table not closed by a result line:\n%s", out)
	return nil
}

// checkTable checks that out has one row per size with n iterations and
// positive numbers in every column (but t_stdev, 0 when the kept samples
// agree, a receiver's BW peak, which perftest does not measure: 0, and the
// bandwidth of a few bytes in all, which may round to 0.00 MB/sec).
func checkTable(t *testing.T, side, out string, lat bool, sizes []int, n int, zeroPeak bool) {
	t.Helper()
	rows := table(t, out, lat)
	if len(rows) != len(sizes) {
		t.Fatalf("%s: %d rows for %d sizes:\n%s", side, len(rows), len(sizes), out)
	}
	cols := 5
	if lat {
		cols = 9
	}
	for i, r := range rows {
		if len(r) != cols {
			t.Fatalf("%s: row %q has %d columns, want %d", side, r, len(r), cols)
		}
		if size, err := strconv.Atoi(r[0]); err != nil || size != sizes[i] {
			t.Errorf("%s: row %d: #bytes %q, want %d", side, i, r[0], sizes[i])
		}
		if iters, err := strconv.Atoi(r[1]); err != nil || iters != n {
			t.Errorf("%s: row %d: #iterations %q, want %d", side, i, r[1], n)
		}
		v := make([]float64, len(r)-2)
		for j, f := range r[2:] {
			x, err := strconv.ParseFloat(f, 64)
			if err != nil {
				t.Fatalf("%s: row %q: column %d: %v", side, r, j+2, err)
			}
			v[j] = x
			// A bandwidth of a few bytes prints as 0.00 MB/sec when the
			// machine is slow to schedule the receiver (perftest's format).
			tiny := !lat && j < 2 && sizes[i]*n < 4096
			mayBeZero := lat && j == 4 || zeroPeak && j == 0 || tiny
			if x < 0 || x == 0 && !mayBeZero {
				t.Errorf("%s: row %q: column %d is %v, want > 0", side, r, j+2, x)
			}
		}
		// t_min ≤ t_typical ≤ t_max, t_min ≤ t_avg, p99 ≤ p99.9 ≤ t_max.
		if lat && !(v[0] <= v[2] && v[2] <= v[1] && v[0] <= v[3] && v[5] <= v[6] && v[6] <= v[1]) {
			t.Errorf("%s: row %q: statistics out of order", side, r)
		}
	}
}

// TestEndToEnd runs every test against a server process, with both
// memory kinds, and checks both sides' tables.
func TestEndToEnd(t *testing.T) {
	type tc struct {
		name  string
		args  []string
		sizes []int
		n     int
	}
	var cases []tc
	for _, mem := range []string{"shm", "cma"} {
		for k := sendLat; k <= readBW; k++ {
			n, size := 200, defSizeBW
			if k.lat() {
				n, size = 50, defSizeLat
			}
			cases = append(cases, tc{fmt.Sprintf("%v/device=%s", k, mem), []string{k.String(), "-d", mem, "-n", strconv.Itoa(n)}, []int{size}, n})
		}
	}
	cases = append(cases,
		tc{"send_lat/events", []string{"send_lat", "-e", "-n", "20", "-s", "300"}, []int{300}, 20},
		tc{"read_lat/events", []string{"read_lat", "-e", "-n", "20"}, []int{2}, 20},
		tc{"send_bw/events", []string{"send_bw", "-e", "-n", "100", "-s", "4096"}, []int{4096}, 100},
		tc{"write_bw/events", []string{"write_bw", "-e", "-n", "100"}, []int{65536}, 100},
		tc{"write_lat/all", []string{"write_lat", "-a", "-n", "5"}, allSizes(), 5},
		tc{"send_bw/all", []string{"send_bw", "-a", "-n", "3"}, allSizes(), 3},
		tc{"read_bw/all/device=cma", []string{"read_bw", "-a", "-n", "3", "-d", "cma"}, allSizes(), 3},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k, _ := parseTest(c.args[0])
			s := startServer(t, c.args...)
			cout, err := client(t, s, c.args...)
			if err != nil {
				t.Fatalf("client: %v\n%s", err, cout)
			}
			sout, err := s.wait()
			if err != nil {
				t.Fatalf("server: %v", err)
			}
			checkTable(t, "client", cout, k.lat(), c.sizes, c.n, false)
			checkTable(t, "server", sout, k.lat(), c.sizes, c.n, k == sendBW)
			if strings.Contains(cout, "WARNING") {
				t.Errorf("client warns:\n%s", cout)
			}
			if testing.Verbose() {
				t.Logf("client:\n%s", cout)
			}
		})
	}
}

// TestMismatch: a client whose test, sizes or iterations differ from the
// server's fails on both sides, naming both command lines.
func TestMismatch(t *testing.T) {
	for _, c := range []struct {
		name           string
		server, client []string
		clientWords    string
		serverWords    string
	}{
		{"test", []string{"write_lat", "-n", "10"}, []string{"read_lat", "-n", "10"}, "read_lat -s 2 -n 10", "write_lat -s 2 -n 10"},
		{"sizes", []string{"send_bw", "-a", "-n", "10"}, []string{"send_bw", "-s", "64", "-n", "10"}, "send_bw -s 64 -n 10", "send_bw -a -n 10"},
		{"size", []string{"write_bw", "-n", "10"}, []string{"write_bw", "-s", "4096", "-n", "10"}, "write_bw -s 4096 -n 10", "write_bw -s 65536 -n 10"},
		{"iterations", []string{"send_lat"}, []string{"send_lat", "-n", "10"}, "send_lat -s 2 -n 10", "send_lat -s 2 -n 1000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startServer(t, c.server...)
			_, cerr := client(t, s, c.client...)
			_, serr := s.wait()
			want := fmt.Sprintf("parameters differ: the client runs %q, the server %q", c.clientWords, c.serverWords)
			if cerr == nil || !strings.Contains(cerr.Error(), want) {
				t.Errorf("client error %v, want one saying %s", cerr, want)
			}
			if serr == nil || !strings.Contains(serr.Error(), want) {
				t.Errorf("server error %v, want one saying %s", serr, want)
			}
		})
	}
}

// TestNoRead: read tests fail on both sides, clearly, when either device
// has no RDMA Read; the other tests still run on such a device.
func TestNoRead(t *testing.T) {
	for _, c := range []struct {
		name           string
		server, client []string
		clientSays     string
		serverSays     string
	}{
		{"server", []string{"read_lat", "-n", "10", "--no-read"}, []string{"read_lat", "-n", "10"},
			"read_lat needs RDMA Read, but the server's device has none (started with --no-read)",
			"read_lat needs RDMA Read, but this side's device has none (--no-read)"},
		{"client", []string{"read_bw", "-n", "10"}, []string{"read_bw", "-n", "10", "--no-read"},
			"read_bw needs RDMA Read, but this side's device has none (--no-read)",
			"read_bw needs RDMA Read, but the client's device has none (started with --no-read)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startServer(t, c.server...)
			_, cerr := client(t, s, c.client...)
			_, serr := s.wait()
			if cerr == nil || !strings.Contains(cerr.Error(), c.clientSays) || !errors.Is(cerr, nic.ErrNotSupported) {
				t.Errorf("client error %v, want ErrNotSupported saying %s", cerr, c.clientSays)
			}
			if serr == nil || !strings.Contains(serr.Error(), c.serverSays) {
				t.Errorf("server error %v, want one saying %s", serr, c.serverSays)
			}
		})
	}
	t.Run("write_bw", func(t *testing.T) {
		args := []string{"write_bw", "-n", "10", "--no-read"}
		s := startServer(t, args...)
		if out, err := client(t, s, args...); err != nil {
			t.Fatalf("client: %v\n%s", err, out)
		}
		if _, err := s.wait(); err != nil {
			t.Fatalf("server: %v", err)
		}
	})
}

// TestServerKilled: a server that dies mid-run fails the client with a
// clear error, not a hang.
func TestServerKilled(t *testing.T) {
	args := []string{"write_lat", "-n", "5000000", "-timeout", "0"}
	s := startServer(t, args...)
	errc := make(chan error, 1)
	go func() {
		_, err := client(t, s, args...)
		errc <- err
	}()
	// The server prints the table header once the run has begun.
	s.waitFor(t, strings.TrimSuffix(resultFmtLat, "\n"))
	s.child.Kill()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "the server went away") {
			t.Fatalf("client error %v, want one saying the server went away", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("client still running 30 s after the server was killed")
	}
}

// TestCommand runs the command itself: -h documents every flag and
// environment variable and exits 0; an error is one line on stderr and
// exit status 1.
func TestCommand(t *testing.T) {
	t.Run("help", func(t *testing.T) {
		c := testutil.StartChild(t, "main", nil, "-h")
		if err := c.Wait(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"-s SIZE", "-a\t", "-n ITERS", "-d DEVICE", "-e\t", "-no-read", "-addr ADDRESS", "-timeout",
			envAddr, envDevice, envIters, envEvents, envNoRead, envTimeout, "send_lat", "read_bw", "#bytes #iterations"} {
			if !strings.Contains(c.Output(), want) {
				t.Errorf("-h does not mention %q", want)
			}
		}
	})
	for _, c := range []struct {
		name string
		args []string
		env  string
		says string
	}{
		{"no test", nil, "", "no test given"},
		{"unknown test", []string{"atomic_lat"}, "", `unknown test "atomic_lat"`},
		{"bad size", []string{"send_lat", "-s", "0"}, "", "-s 0: size must be in [1, 8388608]"},
		{"size and all", []string{"send_lat", "-s", "8", "-a"}, "", "-s and -a exclude each other"},
		{"few iterations", []string{"read_lat", "-n", "3"}, "", "at least 5 iterations"},
		{"bad device", []string{"send_bw", "-d", "gpu"}, "", `-d "gpu"`},
		{"events write_lat", []string{"write_lat", "-e"}, "", "write_lat has no event mode"},
		{"bad flag", []string{"send_bw", "-x"}, "", "flag provided but not defined: -x"},
		{"too many", []string{"send_bw", "@a", "@b"}, "", "too many arguments"},
		{"env device", []string{"send_bw"}, envDevice + "=nvme", `-d "nvme"`},
		{"env iters", []string{"send_bw"}, envIters + "=many", envIters + `="many": not an integer`},
		{"no server", []string{"send_bw", "@sdperf-test-nobody-listens"}, "", "connect to the server"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				k, v, _ := strings.Cut(c.env, "=")
				t.Setenv(k, v)
			}
			ch := testutil.StartChild(t, "main", nil, c.args...)
			err := ch.Wait(30 * time.Second)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1", err)
			}
			out := ch.Output()
			if !strings.HasPrefix(out, "sdperf: ") || strings.Count(out, "\n") != 1 || !strings.Contains(out, c.says) {
				t.Errorf("output %q, want one line \"sdperf: …%s…\"", out, c.says)
			}
		})
	}
}
