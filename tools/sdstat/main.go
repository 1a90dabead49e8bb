package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/stats"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sdstat:", oneLine(err))
		os.Exit(1)
	}
}

// oneLine folds an error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Environment variables that give flags their defaults.
const (
	envPID   = "SDSTAT_PID"
	envWatch = "SDSTAT_WATCH"
	envCount = "SDSTAT_COUNT"
	envJSON  = "SDSTAT_JSON"
	envGroup = "SDSTAT_GROUP"

	defaultWatch = time.Second
)

const usageHead = `usage: sdstat [-p PID] [-watch [INTERVAL]] [-count N] [-json] [-g PREFIX]

Shows the counters running sandirect processes publish in shared memory:
devices, queue pairs, the registration cache, connections. It maps each
process's table read-only: the process is neither stopped nor slowed.
Processes are found by their endpoints (abstract sockets
@sandirect-stats-PID, listed in /proc/net/unix), which vanish when they die.
Only processes of the same user are shown, unless sdstat runs as root.

Without -watch it prints every process's table once: group, counter, value.
With -watch it prints them every INTERVAL with the rate of every counter
per second, computed between the process's own refresh times; processes
that start or exit meanwhile come and go. With -p it reads one process
(and -watch ends when that process exits).

Flags:
`

const usageTail = `
Environment variables (defaults of the flags above):
  SDSTAT_PID     -p
  SDSTAT_WATCH   -watch INTERVAL, as a Go duration ("500ms"); sets watch mode
  SDSTAT_COUNT   -count
  SDSTAT_JSON    -json, as a boolean ("1", "true", …)
  SDSTAT_GROUP   -g

Exit status 1 with one line on stderr on any error, including a -p process
that publishes nothing. Another user's process is reported in its place,
not as an error.

Examples:
  sdstat                        # every process, once
  sdstat -p 4242 -watch         # one process, every second, with rates
  sdstat -watch 200ms -g device/1/qp
  sdstat -json | jq '.processes[].counters[] | select(.name=="hits")'
`

type options struct {
	pid   int
	watch time.Duration // 0: one shot
	count int           // updates to print with -watch; 0: until interrupted
	json  bool
	group string // group prefix filter
}

// watchFlag is -watch: a boolean flag that also takes an interval.
type watchFlag struct{ d *time.Duration }

func (w watchFlag) String() string {
	if w.d == nil || *w.d == 0 {
		return ""
	}
	return w.d.String()
}

func (w watchFlag) IsBoolFlag() bool { return true }

func (w watchFlag) Set(s string) error {
	if b, err := strconv.ParseBool(s); err == nil {
		*w.d = 0
		if b {
			*w.d = defaultWatch
		}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Millisecond {
		return fmt.Errorf("want an interval of at least 1ms, such as 500ms")
	}
	*w.d = d
	return nil
}

// parseArgs returns the checked options, or nil after -h.
func parseArgs(stdout io.Writer, args []string) (*options, error) {
	o := &options{}
	var err error
	if v := os.Getenv(envPID); v != "" {
		if o.pid, err = strconv.Atoi(v); err != nil || o.pid <= 0 {
			return nil, fmt.Errorf("%s=%q: not a pid", envPID, v)
		}
	}
	if v := os.Getenv(envWatch); v != "" {
		if err := (watchFlag{&o.watch}).Set(v); err != nil {
			return nil, fmt.Errorf("%s=%q: %v", envWatch, v, err)
		}
	}
	if v := os.Getenv(envCount); v != "" {
		if o.count, err = strconv.Atoi(v); err != nil || o.count < 0 {
			return nil, fmt.Errorf("%s=%q: not a count ≥ 0", envCount, v)
		}
	}
	if v := os.Getenv(envJSON); v != "" {
		if o.json, err = strconv.ParseBool(v); err != nil {
			return nil, fmt.Errorf("%s=%q: not a boolean", envJSON, v)
		}
	}
	o.group = os.Getenv(envGroup)

	fs := flag.NewFlagSet("sdstat", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, -h is printed below
	fs.IntVar(&o.pid, "p", o.pid, "read only the process `PID`")
	fs.Var(watchFlag{&o.watch}, "watch", "print again every `INTERVAL` (default 1s when given alone), with rates per second")
	fs.IntVar(&o.count, "count", o.count, "with -watch, stop after `N` updates (0: until interrupted)")
	fs.BoolVar(&o.json, "json", o.json, "print JSON: one object, or one per line with -watch")
	fs.StringVar(&o.group, "g", o.group, "show only groups that start with `PREFIX` (device/1, device/1/qp, sockets, …)")
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, usageHead)
				fs.SetOutput(stdout)
				fs.PrintDefaults()
				fs.SetOutput(io.Discard)
				fmt.Fprint(stdout, usageTail)
				return nil, nil
			}
			return nil, err
		}
		// "-watch 2s -count 3": the interval parses as an argument, and
		// the flags after it are parsed again.
		args = fs.Args()
		if o.watch == 0 || len(args) == 0 {
			break
		}
		if _, err := time.ParseDuration(args[0]); err != nil {
			break
		}
		if err := (watchFlag{&o.watch}).Set(args[0]); err != nil {
			return nil, fmt.Errorf("-watch %s: %v", args[0], err)
		}
		args = args[1:]
	}
	rest := args
	switch {
	case len(rest) > 0:
		return nil, fmt.Errorf("unexpected argument %q (see -h)", rest[0])
	case o.pid < 0:
		return nil, fmt.Errorf("-p %d: not a pid", o.pid)
	case o.count < 0:
		return nil, fmt.Errorf("-count %d: want ≥ 0", o.count)
	case o.count > 0 && o.watch == 0:
		return nil, fmt.Errorf("-count needs -watch")
	}
	return o, nil
}

// run parses args, reads the tables and prints them to stdout.
func run(ctx context.Context, stdout io.Writer, args []string) error {
	o, err := parseArgs(stdout, args)
	if err != nil || o == nil {
		return err
	}
	m := &monitor{o: o, procs: map[int]*proc{}}
	defer m.close()
	if o.watch == 0 {
		views, err := m.poll()
		if err != nil {
			return err
		}
		return m.print(stdout, views)
	}
	tick := time.NewTicker(o.watch)
	defer tick.Stop()
	for n := 1; ; n++ {
		views, err := m.poll()
		if err != nil {
			return err
		}
		if err := m.print(stdout, views); err != nil {
			return err
		}
		if (o.count > 0 && n >= o.count) || (o.pid != 0 && len(m.procs) == 0) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // interrupted: the normal end of -watch
		case <-tick.C:
		}
	}
}

// monitor keeps a reader, and the last snapshot for rates, per process.
type monitor struct {
	o     *options
	procs map[int]*proc
	polls int
}

type proc struct {
	pid   int
	comm  string
	r     *stats.Reader
	prev  *stats.Snapshot       // the last snapshot with a new refresh time
	rates map[[2]string]float64 // from prev's predecessor to prev
}

// view is what one poll has to show about one process.
type view struct {
	pid   int
	comm  string
	snap  *stats.Snapshot
	rates map[[2]string]float64 // nil: none yet (or one shot)
	err   error                 // the process could not be read
	gone  bool                  // it exited or stopped publishing since the last poll
}

func (m *monitor) close() {
	for _, p := range m.procs {
		p.r.Close()
	}
}

// poll reads every process once.
func (m *monitor) poll() ([]view, error) {
	m.polls++
	var targets []stats.Endpoint
	if m.o.pid != 0 {
		if m.polls == 1 || m.procs[m.o.pid] != nil {
			targets = []stats.Endpoint{{PID: m.o.pid}}
		}
	} else {
		eps, err := stats.List()
		if err != nil {
			return nil, err
		}
		targets = eps
	}
	var views []view
	wanted := map[int]bool{}
	for _, ep := range targets {
		wanted[ep.PID] = true
		p := m.procs[ep.PID]
		if p == nil {
			r, err := stats.Open(ep.PID)
			switch {
			case err == nil:
				comm := ep.Comm
				if comm == "" {
					comm = commOf(ep.PID)
				}
				p = &proc{pid: ep.PID, comm: comm, r: r}
				m.procs[ep.PID] = p
			case m.o.pid != 0:
				return nil, err
			case errors.Is(err, stats.ErrNotFound), errors.Is(err, stats.ErrGone):
				continue // exited between List and Open
			default:
				views = append(views, view{pid: ep.PID, comm: ep.Comm, err: err})
				continue
			}
		}
		s, err := p.r.Snapshot()
		switch {
		case errors.Is(err, stats.ErrGone):
			views = append(views, view{pid: p.pid, comm: p.comm, gone: true})
			m.drop(p)
			continue
		case err != nil:
			views = append(views, view{pid: p.pid, comm: p.comm, err: err})
			continue
		}
		v := view{pid: p.pid, comm: p.comm, snap: &s}
		if m.o.watch != 0 {
			p.update(&s)
			v.rates = p.rates
		}
		views = append(views, v)
	}
	for pid, p := range m.procs {
		if !wanted[pid] {
			views = append(views, view{pid: pid, comm: p.comm, gone: true})
			m.drop(p)
		}
	}
	return views, nil
}

func (m *monitor) drop(p *proc) {
	p.r.Close()
	delete(m.procs, p.pid)
}

// update computes rates per second between the last snapshot with a
// different refresh time and s, using the publisher's clock: a reader that
// polls faster than the process refreshes keeps the last rates.
func (p *proc) update(s *stats.Snapshot) {
	if p.prev != nil && !s.Time.After(p.prev.Time) {
		return
	}
	if p.prev != nil {
		dt := s.Time.Sub(p.prev.Time).Seconds()
		old := make(map[[2]string]uint64, len(p.prev.Counters))
		for _, c := range p.prev.Counters {
			old[[2]string{c.Group, c.Name}] = c.Value
		}
		p.rates = make(map[[2]string]float64, len(s.Counters))
		for _, c := range s.Counters {
			k := [2]string{c.Group, c.Name}
			if v, ok := old[k]; ok {
				// A level may go down: the difference is signed.
				p.rates[k] = float64(int64(c.Value-v)) / dt
			}
		}
	}
	p.prev = s
}

// commOf returns pid's command name for a process that List did not name.
func commOf(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return -1
		}
		return r
	}, string(b))
}

func (m *monitor) print(w io.Writer, views []view) error {
	if m.o.json {
		return m.printJSON(w, views)
	}
	return m.printText(w, views)
}

func (m *monitor) show(c stats.Counter) bool { return strings.HasPrefix(c.Group, m.o.group) }

// JSON output: one object per poll.
type jsonPoll struct {
	Time      time.Time     `json:"time"`
	Processes []jsonProcess `json:"processes"`
}

type jsonProcess struct {
	PID        int           `json:"pid"`
	Comm       string        `json:"comm,omitempty"`
	Refreshed  *time.Time    `json:"refreshed,omitempty"`
	IntervalMS float64       `json:"interval_ms,omitempty"`
	Dropped    uint64        `json:"dropped,omitempty"`
	Gone       bool          `json:"gone,omitempty"`
	Error      string        `json:"error,omitempty"`
	Counters   []jsonCounter `json:"counters,omitempty"`
}

type jsonCounter struct {
	Group string   `json:"group"`
	Name  string   `json:"name"`
	Value uint64   `json:"value"`
	Rate  *float64 `json:"rate,omitempty"`
}

func (m *monitor) printJSON(w io.Writer, views []view) error {
	out := jsonPoll{Time: time.Now(), Processes: []jsonProcess{}}
	for _, v := range views {
		jp := jsonProcess{PID: v.pid, Comm: v.comm, Gone: v.gone}
		if v.err != nil {
			jp.Error = oneLine(v.err)
		}
		if s := v.snap; s != nil {
			t := s.Time
			jp.Refreshed = &t
			jp.IntervalMS = float64(s.Interval) / float64(time.Millisecond)
			jp.Dropped = s.Dropped
			jp.Counters = []jsonCounter{}
			for _, c := range s.Counters {
				if !m.show(c) {
					continue
				}
				jc := jsonCounter{Group: c.Group, Name: c.Name, Value: c.Value}
				if r, ok := v.rates[[2]string{c.Group, c.Name}]; ok {
					jc.Rate = &r
				}
				jp.Counters = append(jp.Counters, jc)
			}
		}
		out.Processes = append(out.Processes, jp)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func (m *monitor) printText(w io.Writer, views []view) error {
	if m.o.watch != 0 {
		fmt.Fprintf(w, "--- %s\n", time.Now().Format("15:04:05.000"))
	}
	if len(views) == 0 {
		_, err := fmt.Fprintln(w, "no sandirect process publishes statistics")
		return err
	}
	for i, v := range views {
		if i > 0 {
			fmt.Fprintln(w)
		}
		name := fmt.Sprintf("pid %d", v.pid)
		if v.comm != "" {
			name += " (" + v.comm + ")"
		}
		switch {
		case v.gone:
			fmt.Fprintf(w, "%s: gone\n", name)
			continue
		case v.err != nil:
			fmt.Fprintf(w, "%s: %s\n", name, oneLine(v.err))
			continue
		}
		s := v.snap
		fmt.Fprintf(w, "%s  refreshed %s, every %v", name, s.Time.Format("15:04:05.000"), s.Interval)
		if s.Dropped > 0 {
			fmt.Fprintf(w, ", %d counters dropped", s.Dropped)
		}
		fmt.Fprintln(w)
		rows := [][]string{{"GROUP", "COUNTER", "VALUE"}}
		if m.o.watch != 0 {
			rows[0] = append(rows[0], "RATE/s")
		}
		for _, c := range s.Counters {
			if !m.show(c) {
				continue
			}
			row := []string{c.Group, c.Name, strconv.FormatUint(c.Value, 10)}
			if m.o.watch != 0 {
				rate := "-"
				if r, ok := v.rates[[2]string{c.Group, c.Name}]; ok {
					rate = formatRate(r)
				}
				row = append(row, rate)
			}
			rows = append(rows, row)
		}
		if len(rows) == 1 {
			fmt.Fprintf(w, "no counters in groups %s*\n", m.o.group)
			continue
		}
		if err := printTable(w, rows); err != nil {
			return err
		}
	}
	return nil
}

// printTable prints rows in columns two spaces apart: the first two
// (group, counter) aligned left, the numbers right.
func printTable(w io.Writer, rows [][]string) error {
	var width []int
	for _, r := range rows {
		for i, c := range r {
			if i == len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], len(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		for i, c := range r {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-len(c))
			if i < 2 {
				b.WriteString(c)
				if i < len(r)-1 {
					b.WriteString(pad)
				}
			} else {
				b.WriteString(pad)
				b.WriteString(c)
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func formatRate(r float64) string {
	if r == float64(int64(r)) {
		return strconv.FormatInt(int64(r), 10)
	}
	return strconv.FormatFloat(r, 'f', 1, 64)
}
