package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progressBar keeps one status line at the bottom of a terminal:
//
//	[=========>          ] 41/97 rows, last: conn stream unix 1MiB  0:37
//
// It is redrawn after every row and every second; table output written
// through out clears it first, so the two never mix. Safe for concurrent
// use.
type progressBar struct {
	mu      sync.Mutex // guards the fields below and the writes to term
	term    io.Writer
	total   int // rows expected; 0: unknown
	done    int
	suite   string
	label   string
	start   time.Time
	shown   bool // the line is on the screen
	stopped chan struct{}
	wg      sync.WaitGroup
}

// isTerminal tells whether f is a character device (a terminal), as far as
// the standard library can tell without ioctls: good enough to keep the bar
// out of files, pipes and CI logs.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func newProgressBar(term io.Writer, total int) *progressBar {
	p := &progressBar{term: term, total: total, start: time.Now(), stopped: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.mu.Lock()
				p.draw()
				p.mu.Unlock()
			case <-p.stopped:
				return
			}
		}
	}()
	return p
}

// step counts one row of suite, label being what it measured.
func (p *progressBar) step(suite, label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.suite, p.label = suite, label
	p.draw()
}

// stop removes the line for good.
func (p *progressBar) stop() {
	close(p.stopped)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
}

const barWidth = 24

// draw writes the line; the caller holds mu.
func (p *progressBar) draw() {
	select {
	case <-p.stopped:
		return
	default:
	}
	el := time.Since(p.start).Round(time.Second)
	elapsed := fmt.Sprintf("%d:%02d", int(el.Minutes()), int(el.Seconds())%60)
	var line string
	if p.total > 0 {
		frac := min(1, float64(p.done)/float64(p.total))
		n := int(frac * barWidth)
		bar := strings.Repeat("=", n)
		if n < barWidth {
			bar += ">" + strings.Repeat(" ", barWidth-n-1)
		}
		line = fmt.Sprintf("[%s] %d/%d rows", bar, min(p.done, p.total), p.total)
	} else {
		line = fmt.Sprintf("%d rows", p.done)
	}
	if p.suite != "" {
		line += ", last: " + p.suite
		if p.label != "" {
			line += " " + p.label
		}
	}
	line += "  " + elapsed
	fmt.Fprintf(p.term, "\r\x1b[K%s", line)
	p.shown = true
}

// clear removes the line; the caller holds mu.
func (p *progressBar) clear() {
	if p.shown {
		fmt.Fprint(p.term, "\r\x1b[K")
		p.shown = false
	}
}

// writer returns w wrapped so that each write clears the line first and
// every complete line written redraws it.
func (p *progressBar) writer(w io.Writer) io.Writer { return &barWriter{p, w} }

type barWriter struct {
	p *progressBar
	w io.Writer
}

func (b *barWriter) Write(s []byte) (int, error) {
	b.p.mu.Lock()
	defer b.p.mu.Unlock()
	b.p.clear()
	n, err := b.w.Write(s)
	if len(s) > 0 && s[len(s)-1] == '\n' {
		b.p.draw()
	}
	return n, err
}
