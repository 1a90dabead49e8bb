package main

// The plots: for every suite, one figure with a latency panel
// (p50 against message size, bars from min to p99) and/or a bandwidth panel
// (GB/s against message size, bars from the slowest to the fastest chunk),
// log-log, one line per transport (per case and transport where a suite has
// several cases of a kind), the floors as dashed grey references, and the
// hardware in the title. Each figure is written as SVG and PNG.

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// A series is one line of a panel: y against message size, with its spread.
type series struct {
	name      string // legend text
	transport string // picks the style
	ref       bool   // a reference (floor): dashed grey, no markers
	x, y      []float64
	lo, hi    []float64 // spread, absolute; nil: none
}

// panelKind is what a panel shows.
type panelKind struct {
	metric, lo, hi string // the records: y and its spread
	title          string
	yLabel         string
	yTicks         func(min, max float64) []plot.Tick
}

var (
	latencyPanel = panelKind{metricLatP50, metricLatMin, metricLatP99,
		"latency: half round trip, median (bars: min to p99)", "half round trip", timeTicks}
	bandwidthPanel = panelKind{metricBW, metricBWMin, metricBWMax,
		"bandwidth, one way (bars: slowest to fastest chunk)", "GB/s", gbpsTicks}
)

// collectSeries returns the series of suite for kind: one per case and
// transport with a positive value, in the order the records came.
func collectSeries(req *request, suite string, kind panelKind) []*series {
	recs := req.Records
	type key struct{ cas, transport string }
	byKey := map[key]*series{}
	var order []key
	cases := map[string]bool{}
	spread := func(r Record, metric string) (float64, bool) {
		for _, o := range recs {
			if o.Suite == r.Suite && o.Case == r.Case && o.Transport == r.Transport && o.Size == r.Size && o.Metric == metric {
				return o.Value, o.Value > 0
			}
		}
		return 0, false
	}
	for _, r := range recs {
		if r.Suite != suite || r.Metric != kind.metric || r.Size <= 0 || !(r.Value > 0) {
			continue
		}
		if suite != "floor" && req.isReference(r.Transport) {
			continue // an interleaved reference: drawn as one (references)
		}
		k := key{r.Case, r.Transport}
		s := byKey[k]
		if s == nil {
			s = &series{transport: r.Transport}
			byKey[k] = s
			order = append(order, k)
			cases[r.Case] = true
		}
		s.x = append(s.x, float64(r.Size))
		s.y = append(s.y, r.Value)
		lo, ok1 := spread(r, kind.lo)
		hi, ok2 := spread(r, kind.hi)
		if !ok1 || !ok2 {
			lo, hi = r.Value, r.Value
		}
		s.lo = append(s.lo, min(lo, r.Value))
		s.hi = append(s.hi, max(hi, r.Value))
	}
	var out []*series
	for _, k := range order {
		s := byKey[k]
		s.name = k.transport
		if len(cases) > 1 {
			s.name = k.cas + " " + k.transport
		}
		out = append(out, s)
	}
	return out
}

// references returns the floors a panel of suite is drawn against.
func references(req *request, suite string, kind panelKind) []*series {
	recs := req.Records
	if suite == "floor" {
		return nil
	}
	var out []*series
	if kind.metric == metricLatP50 {
		for _, f := range []struct{ transport, name string }{
			{"cacheline", "floor: cache-line hand-off"},
			{"futex", "floor: futex wake-up (pinned)"},
			{"futex/unpinned", "floor: futex wake-up (unpinned)"},
			{"futexcond/unpinned", "floor: futex, waking only sleepers (unpinned)"},
		} {
			if suite != "conn" && strings.HasSuffix(f.transport, "/unpinned") {
				continue
			}
			// The suite's own row, measured interleaved with its
			// transports, if it has one; else the floor suite's.
			for _, src := range []string{suite, "floor"} {
				i := slices.IndexFunc(recs, func(r Record) bool {
					return r.Suite == src && r.Case == "pingpong" && r.Transport == f.transport && r.Metric == metricLatP50
				})
				if i >= 0 {
					out = append(out, &series{name: f.name, transport: f.transport, ref: true, y: []float64{recs[i].Value}})
					break
				}
			}
		}
		return out
	}
	for _, s := range collectSeries(req, "floor", kind) {
		switch s.transport {
		case "memcpy":
			s.name, s.ref, s.lo, s.hi = "floor: single-core copy()", true, nil, nil
			out = append(out, s)
		case "pipeline/best":
			s.name, s.ref, s.lo, s.hi = "floor: two-core pipeline (placement's best)", true, nil, nil
			out = append(out, s)
		}
	}
	return out
}

// Colours: our transports warm and drawn heavier, the baselines cool.
var transportColors = map[string]color.RGBA{
	"sockets/busy":        {0xd6, 0x27, 0x28, 0xff},
	"sockets/block":       {0xff, 0x7f, 0x0e, 0xff},
	"sockets/busy+shared": {0x8c, 0x1a, 0x1a, 0xff},
	"sockets/forcetcp":    {0xe3, 0x77, 0xc2, 0xff},
	"sockets/default":     {0xe7, 0xba, 0x52, 0xff}, // beside sockets/busy in the conn figure
	"grpc/sandirect":      {0xd6, 0x27, 0x28, 0xff},
	"grpc/unix":           {0x1f, 0x77, 0xb4, 0xff},
	"grpc/tcp":            {0x17, 0xbe, 0xcf, 0xff},
	"http/sandirect":      {0xff, 0x7f, 0x0e, 0xff},
	"http/unix":           {0x2c, 0xa0, 0x2c, 0xff},
	"http/tcp":            {0x94, 0x67, 0xbd, 0xff},
	"unix":                {0x1f, 0x77, 0xb4, 0xff},
	"tcp":                 {0x17, 0xbe, 0xcf, 0xff},
	"pipe":                {0x2c, 0xa0, 0x2c, 0xff},
	"shmipc":              {0x94, 0x67, 0xbd, 0xff},
	"ucx/tag":             {0x39, 0x3b, 0x79, 0xff},
	"ucx/stream":          {0x6b, 0x6e, 0xcf, 0xff},
	"ofi/shm":             {0x63, 0x79, 0x39, 0xff},
}

var otherColors = []color.RGBA{
	{0xd6, 0x27, 0x28, 0xff}, {0x1f, 0x77, 0xb4, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xff, 0x7f, 0x0e, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0x17, 0xbe, 0xcf, 0xff}, {0xbc, 0xbd, 0x22, 0xff},
	{0xe3, 0x77, 0xc2, 0xff}, {0x7f, 0x7f, 0x7f, 0xff},
}

func ours(transport string) bool {
	for _, p := range []string{"sockets/", "ring/", "nic/"} {
		if strings.HasPrefix(transport, p) {
			return true
		}
	}
	return strings.HasSuffix(transport, "/sandirect")
}

var glyphShapes = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{},
	draw.PyramidGlyph{}, draw.RingGlyph{}, draw.BoxGlyph{}, draw.CrossGlyph{}, draw.PlusGlyph{}}

// style gives series i of a figure its colour, width and marker.
func style(s *series, i int) (draw.LineStyle, draw.GlyphStyle) {
	c, ok := transportColors[s.transport]
	if !ok || s.name != s.transport {
		c = otherColors[i%len(otherColors)] // not a conn transport, or one of several cases
	}
	ls := draw.LineStyle{Color: c, Width: vg.Points(1.2)}
	if ours(s.transport) {
		ls.Width = vg.Points(2.2)
	}
	gs := draw.GlyphStyle{Color: c, Radius: vg.Points(2.5), Shape: glyphShapes[i%len(glyphShapes)]}
	if s.ref {
		ls = draw.LineStyle{Color: color.Gray{0x70}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(4), vg.Points(3)}}
		if strings.Contains(s.name, "futex") {
			ls.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
		}
		if strings.Contains(s.name, "unpinned") {
			ls.Color = color.Gray{0xa8}
		}
		if s.transport == "pipeline/best" {
			ls.Color = color.Gray{0x30}
			ls.Dashes = []vg.Length{vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)}
		}
	}
	return ls, gs
}

// xy implements plotter.XYer and YErrorer over a series, x shifted by a
// factor so that the bars of neighbouring series do not hide each other.
type xy struct {
	s     *series
	shift float64
}

func (p xy) Len() int                { return len(p.s.x) }
func (p xy) XY(i int) (x, y float64) { return p.s.x[i] * p.shift, p.s.y[i] }
func (p xy) YError(i int) (float64, float64) {
	return p.s.y[i] - p.s.lo[i], p.s.hi[i] - p.s.y[i]
}

// newPanel draws the series of one kind; legend collects their entries.
func newPanel(kind panelKind, ss, refs []*series, add func(string, ...plot.Thumbnailer)) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = kind.title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = "message size (bytes)"
	p.Y.Label.Text = kind.yLabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.TickerFunc(sizeTicks)
	p.X.Tick.Label.Font.Size = vg.Points(8.5)
	p.Y.Tick.Marker = plot.TickerFunc(kind.yTicks)
	p.Add(plotter.NewGrid())

	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for i := range s.x {
			xmin, xmax = min(xmin, s.x[i]), max(xmax, s.x[i])
			ymin, ymax = min(ymin, s.lo[i]), max(ymax, s.hi[i])
		}
	}
	if math.IsInf(xmin, 0) {
		return nil, nil
	}
	xlo, xhi := xmin/1.6, xmax*1.6

	for i, s := range ss {
		ls, gs := style(s, i)
		shift := math.Pow(2, (float64(i)-float64(len(ss)-1)/2)*0.07)
		pts := xy{s, shift}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		line.LineStyle = ls
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle = gs
		p.Add(line, sc)
		if len(s.lo) > 0 {
			eb, err := plotter.NewYErrorBars(pts)
			if err != nil {
				return nil, err
			}
			eb.LineStyle = draw.LineStyle{Color: ls.Color, Width: vg.Points(0.8)}
			eb.CapWidth = vg.Points(4)
			p.Add(eb)
		}
		add(s.name, line, sc)
	}
	for i, r := range refs {
		ls, _ := style(r, i)
		var line *plotter.Line
		var err error
		if len(r.x) == 0 { // one number: a horizontal line across the panel
			line, err = plotter.NewLine(plotter.XYs{{X: xlo, Y: r.y[0]}, {X: xhi, Y: r.y[0]}})
		} else {
			// The curve where the panel has sizes, one point beyond.
			var pts plotter.XYs
			for i, x := range r.x {
				if x >= xlo/4 && x <= xhi*4 {
					pts = append(pts, plotter.XY{X: x, Y: r.y[i]})
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, err = plotter.NewLine(pts)
		}
		if err != nil {
			return nil, err
		}
		line.LineStyle = ls
		p.Add(line)
		add(r.name, line)
		for _, y := range line.XYs {
			if y.X >= xlo && y.X <= xhi {
				ymin, ymax = min(ymin, y.Y), max(ymax, y.Y)
			}
		}
	}
	// After the plotters: Add widens the axes to all their data.
	p.X.Min, p.X.Max = xlo, xhi
	p.Y.Min, p.Y.Max = ymin/1.8, ymax*1.8
	return p, nil
}

// figure is one suite's plot: a title, one or two panels side by side,
// the legend to their right.
type figure struct {
	name   string // file name without extension
	title  string
	panels []*plot.Plot
	legend plot.Legend
	names  []string // the legend's texts, for its width
}

// addLegend adds an entry once.
func (f *figure) addLegend(name string, th ...plot.Thumbnailer) {
	if !slices.Contains(f.names, name) {
		f.names = append(f.names, name)
		f.legend.Add(name, th...)
	}
}

func suiteFigure(req *request, suite string) (*figure, error) {
	f := &figure{name: suite, legend: plot.NewLegend()}
	f.legend.Top, f.legend.Left = true, true
	f.legend.TextStyle.Font.Size = vg.Points(10)
	f.legend.ThumbnailWidth = vg.Points(24)
	meta := req.suite(suite)
	for _, kind := range []panelKind{latencyPanel, bandwidthPanel} {
		kind = meta.relabel(kind)
		ss := collectSeries(req, suite, kind)
		// A panel needs at least one line: a series of two sizes or more.
		if !slices.ContainsFunc(ss, func(s *series) bool { return len(s.x) >= 2 }) {
			continue
		}
		p, err := newPanel(kind, ss, references(req, suite, kind), f.addLegend)
		if err != nil {
			return nil, err
		}
		if p != nil {
			f.panels = append(f.panels, p)
		}
	}
	if len(f.panels) == 0 {
		return nil, nil
	}
	doc := suite
	if meta.Doc != "" {
		doc = suite + ": " + meta.Doc
	}
	f.title = doc + "\n" + req.Hardware
	return f, nil
}

// draw lays the figure out on c.
func (f *figure) draw(c draw.Canvas) {
	c.SetColor(color.White)
	c.Fill(c.Rectangle.Path())

	title := draw.TextStyle{Color: color.Black, Font: f.legend.TextStyle.Font, Handler: f.legend.TextStyle.Handler,
		XAlign: draw.XCenter, YAlign: draw.YTop}
	title.Font.Size = vg.Points(12)
	top := c.Max.Y - vg.Points(8)
	c.FillText(title, vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: top}, f.title)
	th := title.Height(f.title) + vg.Points(14)

	legendW := vg.Points(0)
	for _, e := range f.names {
		legendW = max(legendW, f.legend.TextStyle.Width(e))
	}
	legendW += f.legend.ThumbnailWidth + vg.Points(24)

	area := draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: c.Min.X + vg.Points(6), Y: c.Min.Y + vg.Points(6)},
		Max: vg.Point{X: c.Max.X - legendW, Y: c.Max.Y - th}}}
	w := (area.Max.X - area.Min.X) / vg.Length(len(f.panels))
	for i, p := range f.panels {
		pc := area
		pc.Min.X = area.Min.X + w*vg.Length(i)
		pc.Max.X = pc.Min.X + w - vg.Points(10)
		p.Draw(pc)
	}
	lc := draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: c.Max.X - legendW + vg.Points(6), Y: c.Min.Y},
		Max: vg.Point{X: c.Max.X, Y: c.Max.Y - th - vg.Points(20)}}}
	f.legend.Draw(lc)
}

// write saves the figure as dir/name.svg and dir/name.png.
func (f *figure) write(dir string) ([]string, error) {
	w := vg.Inch * vg.Length(3.2+4.6*float64(len(f.panels)))
	h := vg.Inch * 5.2
	var paths []string

	svg := vgsvg.New(w, h)
	f.draw(draw.New(svg))
	p := filepath.Join(dir, f.name+".svg")
	if err := writeTo(p, svg); err != nil {
		return paths, err
	}
	paths = append(paths, p)

	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110), vgimg.UseBackgroundColor(color.White))
	f.draw(draw.New(img))
	p = filepath.Join(dir, f.name+".png")
	if err := writeTo(p, vgimg.PngCanvas{Canvas: img}); err != nil {
		return paths, err
	}
	return append(paths, p), nil
}

func writeTo(path string, w interface {
	WriteTo(w io.Writer) (int64, error)
}) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = w.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ---- ticks ----

// sizeTicks marks every power of two, labelled at the even ones (4, 16,
// 64, …, 1K, …).
func sizeTicks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := 0; e <= 40; e++ {
		v := math.Ldexp(1, e)
		if v < lo || v > hi {
			continue
		}
		t := plot.Tick{Value: v}
		if e%2 == 0 {
			t.Label = shortSize(int(v))
		}
		ts = append(ts, t)
	}
	return ts
}

func shortSize(n int) string {
	switch {
	case n >= miB:
		return fmt.Sprintf("%dM", n/miB)
	case n >= kiB:
		return fmt.Sprintf("%dK", n/kiB)
	}
	return fmt.Sprint(n)
}

// decadeTicks marks 1, 2 and 5 of every decade, labelling the decades
// with label (and 2 and 5 too on a range of two decades or less).
func decadeTicks(lo, hi float64, label func(float64) string) []plot.Tick {
	var ts []plot.Tick
	all := hi/lo <= 150
	for e := int(math.Floor(math.Log10(lo))); e <= int(math.Ceil(math.Log10(hi))); e++ {
		d := math.Pow10(e)
		for _, m := range []float64{1, 2, 5} {
			v := d * m
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || all {
				t.Label = label(v)
			}
			ts = append(ts, t)
		}
	}
	return ts
}

func timeTicks(lo, hi float64) []plot.Tick {
	return decadeTicks(lo, hi, func(ns float64) string {
		switch {
		case ns >= 1e9:
			return fmt.Sprintf("%g s", ns/1e9)
		case ns >= 1e6:
			return fmt.Sprintf("%g ms", ns/1e6)
		case ns >= 1e3:
			return fmt.Sprintf("%g µs", ns/1e3)
		}
		return fmt.Sprintf("%g ns", ns)
	})
}

func gbpsTicks(lo, hi float64) []plot.Tick {
	return decadeTicks(lo, hi, func(v float64) string { return fmt.Sprintf("%g", v) })
}
