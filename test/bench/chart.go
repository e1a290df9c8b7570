package main

// Charts: the bench draws PNGs with gonum.org/v1/plot (only the driver imports
// it; the daemon's binary does not) and keeps the data of each beside it as
// JSON, with the command that ran the bench and the commit it ran.

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// chartData is the JSON beside a chart: what the chart shows and how the
// bench that made it ran.
type chartData struct {
	Chart   string        `json:"chart"`
	Title   string        `json:"title"`
	X       string        `json:"x"`
	Y       string        `json:"y"`
	Note    string        `json:"note,omitempty"`
	Command string        `json:"command"`
	Driver  []string      `json:"driver_command"`
	Commit  string        `json:"commit"`
	Started time.Time     `json:"bench_started"`
	Series  []chartSeries `json:"series"`
	Marks   []chartMark   `json:"marks,omitempty"`
}

// chartSeries is one line: its points as [x, y].
type chartSeries struct {
	Name   string       `json:"name"`
	Points [][2]float64 `json:"points"`
}

// chartMark is a vertical line at X (an event of the run).
type chartMark struct {
	Label string  `json:"label"`
	X     float64 `json:"x"`
}

// chartInfo is how the bench ran, for every chart's data.
func (b *bench) chartInfo(name, title, x, y string) chartData {
	return chartData{Chart: name, Title: title, X: x, Y: y, Command: b.cfg.command, Driver: os.Args,
		Commit: b.cfg.commit, Started: b.res.Started}
}

// latenessFloorMs is where a log axis starts: lateness at or below it (a
// removal before its deadline, which must not happen) is drawn there.
const latenessFloorMs = 0.1

// cdfPoints is the empirical distribution of ds in ms: the i-th smallest
// value with the share of values at or below it, (i+1)/n.
func cdfPoints(ds []time.Duration) [][2]float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	pts := make([][2]float64, len(s))
	for i, d := range s {
		pts[i] = [2]float64{float64(d) / 1e6, float64(i+1) / float64(len(s))}
	}
	return pts
}

// remover is one remover's lateness in a run, for the CDF chart.
type remover struct {
	name string
	late []time.Duration
}

// chartKind is how a chart is drawn.
type chartKind int

const (
	overTime chartKind = iota // linear axes from 0 (RSS over time)
	cdf                       // log x, linear y from 0 to 1
	cdfTail                   // log x, y stretched toward 1: 0.5, 0.9, 0.99, ... equally spaced
)

// writeLatenessCDF draws the lateness CDF of every remover on a log x axis
// twice: base.png with a linear y axis, and base-tail.png with one on which
// 0.9, 0.99 and 0.999 are equally spaced, so that the tail can be read. The
// data of each is in a .json of the same name. It returns the files written.
func (b *bench) writeLatenessCDF(base, title string, removers []remover) ([]string, error) {
	d := b.chartInfo(base+".png", title, "lateness (ms): removal seen by the watcher − deadline",
		"share of the remover's removals with at most that lateness")
	d.Note = fmt.Sprintf("log x axis; lateness at or below %g ms (removals before the deadline count as early) is drawn at %g ms", latenessFloorMs, latenessFloorMs)
	for _, r := range removers {
		if len(r.late) == 0 {
			continue
		}
		l := latencyOf(slices.Clone(r.late))
		d.Series = append(d.Series, chartSeries{
			Name:   fmt.Sprintf("%s (p50 %s, p99 %s, max %s; n=%d)", r.name, ms(l.P50), ms(l.P99), ms(l.Max), l.Count),
			Points: cdfPoints(r.late),
		})
	}
	files, err := b.saveChart(base, d, cdf)
	if err != nil {
		return files, err
	}
	d.Chart, d.Title = base+"-tail.png", title+" (tail)"
	d.Note += "; the y axis is -log10(1 - share): 0.9, 0.99 and 0.999 are equally spaced, and each line ends at its maximum at the top"
	tail, err := b.saveChart(base+"-tail", d, cdfTail)
	return append(files, tail...), err
}

// writeRSSChart draws RSS over time (base.png, data in base.json).
func (b *bench) writeRSSChart(base, title string, series []chartSeries, marks []chartMark) ([]string, error) {
	d := b.chartInfo(base+".png", title, "seconds since podjanitor started", "RSS (MiB, VmRSS of /proc/<pid>/status, every second)")
	d.Series, d.Marks = series, marks
	return b.saveChart(base, d, overTime)
}

// saveChart writes d as base.json and draws it as base.png in the output directory.
func (b *bench) saveChart(base string, d chartData, kind chartKind) ([]string, error) {
	jsonPath := filepath.Join(b.cfg.outDir, base+".json")
	data, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(jsonPath, data, 0o644); err != nil {
		return nil, err
	}
	pngPath := filepath.Join(b.cfg.outDir, base+".png")
	p, err := drawChart(d, kind)
	if err != nil {
		return []string{jsonPath}, err
	}
	if err := p.Save(9*vg.Inch, 5.5*vg.Inch, pngPath); err != nil {
		return []string{jsonPath}, err
	}
	return []string{pngPath, jsonPath}, nil
}

// drawChart makes the plot of d: a line per series and a dashed vertical
// line per mark. A CDF has a log x axis (values clamped to latenessFloorMs)
// and dashed levels at 0.5, 0.9 and 0.99.
func drawChart(d chartData, kind chartKind) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = d.Title
	p.X.Label.Text, p.Y.Label.Text = d.X, d.Y
	p.Add(plotter.NewGrid())
	// Where the lines are not: a CDF's top left, and under the RSS lines.
	p.Legend.Top, p.Legend.Left = kind != overTime, kind != overTime
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(12), vg.Points(-8)
	if kind == overTime {
		p.Legend.XOffs, p.Legend.YOffs = vg.Points(-12), vg.Points(12)
	}
	p.Legend.ThumbnailWidth = vg.Points(24)
	xmin, xmax, ymax, maxN := math.Inf(1), math.Inf(-1), 0.0, 0
	for i, s := range d.Series {
		xys := make(plotter.XYs, len(s.Points))
		for k, pt := range s.Points {
			x := pt[0]
			if kind != overTime {
				x = max(x, latenessFloorMs)
			}
			xys[k] = plotter.XY{X: x, Y: pt[1]}
			xmin, xmax, ymax = min(xmin, x), max(xmax, x), max(ymax, pt[1])
		}
		if len(xys) == 0 {
			continue
		}
		maxN = max(maxN, len(xys))
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("chart %s, series %s: %w", d.Chart, s.Name, err)
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 1, 10
	}
	for k, m := range d.Marks {
		l, err := plotter.NewLine(plotter.XYs{{X: m.X, Y: 0}, {X: m.X, Y: 1}})
		if err != nil {
			return nil, err
		}
		l.Color = color.Gray{Y: 90}
		l.Dashes = plotutil.Dashes(k + 1)
		l.Width = vg.Points(1)
		p.Add(markLine{l}) // from the bottom to the top of the y range the data set
		p.Legend.Add(m.Label, l)
		xmin, xmax = min(xmin, m.X), max(xmax, m.X)
	}
	if kind == overTime {
		p.X.Min, p.X.Max = 0, xmax*1.02
		p.Y.Min, p.Y.Max = 0, max(ymax*1.1, 1)
		return p, nil
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks125{}
	p.X.Min = math.Pow(10, math.Floor(math.Log10(xmin)))
	p.X.Max = math.Pow(10, math.Ceil(math.Log10(xmax)))
	levels := []float64{0.5, 0.9, 0.99}
	p.Y.Min, p.Y.Max = 0, 1
	ticks := plot.ConstantTicks{{Value: 0, Label: "0"}, {Value: 0.25, Label: "0.25"}, {Value: 0.5, Label: "0.5"},
		{Value: 0.75, Label: "0.75"}, {Value: 0.9, Label: "0.9"}, {Value: 1, Label: "1"}}
	if kind == cdfTail {
		// The top is 1 − 1/(2n): the last point of each line, at 1, is drawn there.
		p.Y.Max = 1 - 0.5/float64(max(maxN, 2))
		p.Y.Scale = ninesScale{}
		ticks = plot.ConstantTicks{{Value: 0, Label: "0"}, {Value: 0.5, Label: "0.5 (p50)"}}
		levels = nil
		for k := 1; ; k++ { // 0.9 (p90), 0.99 (p99), 0.999 (p99.9), ...
			q := 1 - math.Pow(10, -float64(k))
			if q > p.Y.Max {
				break
			}
			ticks = append(ticks, plot.Tick{Value: q, Label: fmt.Sprintf("%s (p%s)",
				strconv.FormatFloat(q, 'f', k, 64), strconv.FormatFloat(100*q, 'f', max(k-2, 0), 64))})
			levels = append(levels, q)
		}
		levels = append(levels, 0.5)
	}
	p.Y.Tick.Marker = ticks
	for _, q := range levels {
		l, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: q}, {X: p.X.Max, Y: q}})
		if err != nil {
			return nil, err
		}
		l.Color = color.Gray{Y: 160}
		l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(l)
	}
	return p, nil
}

// ninesScale normalizes a share y in [0, 1) as −log10(1 − y): 0.9, 0.99,
// 0.999 equally spaced. Values above max are drawn at max.
type ninesScale struct{}

func (ninesScale) Normalize(lo, hi, y float64) float64 {
	f := func(v float64) float64 { return -math.Log10(1 - v) }
	return (f(min(y, hi)) - f(lo)) / (f(hi) - f(lo))
}

// markLine is a vertical line from y = 0 to the top of the plot's y range.
type markLine struct{ *plotter.Line }

func (m markLine) Plot(c draw.Canvas, plt *plot.Plot) {
	m.XYs[0].Y, m.XYs[1].Y = plt.Y.Min, plt.Y.Max
	m.Line.Plot(c, plt)
}

// DataRange keeps the mark out of the y range, which the data set.
func (m markLine) DataRange() (xmin, xmax, ymin, ymax float64) {
	return m.XYs[0].X, m.XYs[0].X, math.Inf(1), math.Inf(-1)
}

// logTicks125 labels a log axis at 1, 2 and 5 of every decade (minor ticks
// at the other integers), so that a reader can tell 20 ms from 30 ms.
type logTicks125 struct{}

func (logTicks125) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		dec := math.Pow(10, e)
		for i := 1; i < 10; i++ {
			v := float64(i) * dec
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if i == 1 || i == 2 || i == 5 {
				t.Label = strconv.FormatFloat(v, 'f', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// ------------------------------------------------------------ RSS samples

// rssSampler reads the RSS of a few processes every interval.
type rssSampler struct {
	t0       time.Time
	names    []string
	procs    []func() procStats
	mu       sync.Mutex
	points   [][][2]float64
	done     chan struct{}
	finished chan struct{}
}

// sampleRSS samples each proc's RSS (MiB) against the seconds since t0 until stopped.
func sampleRSS(t0 time.Time, every time.Duration, names []string, procs ...func() procStats) *rssSampler {
	s := &rssSampler{t0: t0, names: names, procs: procs, points: make([][][2]float64, len(procs)),
		done: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(s.finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) sample() {
	at := time.Since(s.t0).Seconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, proc := range s.procs {
		if rss := proc().RSSBytes; rss > 0 { // 0: the process is gone, or not started
			s.points[i] = append(s.points[i], [2]float64{at, float64(rss) / (1 << 20)})
		}
	}
}

// stop takes a last sample and returns a series per process.
func (s *rssSampler) stop() []chartSeries {
	close(s.done)
	<-s.finished
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]chartSeries, len(s.names))
	for i, n := range s.names {
		out[i] = chartSeries{Name: n, Points: s.points[i]}
	}
	return out
}
