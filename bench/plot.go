package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotFile is the name of the plot in the --plot directory; docs link it by this name.
const plotFile = "bench-peers.png"

// figures collects what the plot shows, as the scenarios measure it (medians).
type figures struct {
	uncontendedGoroutines []int
	uncontended           map[int]map[*contender]float64 // goroutines → contender → pairs/s
	hotLocks              []*contender
	hot                   map[*contender]hotRow
	targets               []targetRow // dlock's performance targets, as each scenario measured them
}

// targetRow is one of dlock's performance targets beside its peers (≥ 3× redsync's pairs/s, Jain
// fairness ≥ 0.9, …) and what this run measured for it.
type targetRow struct {
	scenario, target, measured string
	met                        bool
	info                       bool // a figure shown beside the targets, not a target
}

// target records one target's outcome (nil-safe: a scenario run without figures records nothing).
func (f *figures) target(scenario, target string, met bool, format string, args ...any) {
	if f == nil {
		return
	}
	f.targets = append(f.targets, targetRow{scenario: scenario, target: target, measured: fmt.Sprintf(format, args...), met: met})
}

// info records a figure shown beside the targets.
func (f *figures) info(scenario, what string, format string, args ...any) {
	if f == nil {
		return
	}
	f.targets = append(f.targets, targetRow{scenario: scenario, target: what, measured: fmt.Sprintf(format, args...), info: true})
}

// targetsTable is the summary of the recorded targets, in markdown.
func (f *figures) targetsTable() string {
	if f == nil || len(f.targets) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("### Targets in this run\n\n")
	b.WriteString("dlock (rueidis transport) unless said otherwise; the figures are the medians of the tables below.\n\n")
	b.WriteString("| scenario | target | measured | |\n|---|---|---|---|\n")
	for _, t := range f.targets {
		verdict := metUnmet(t.met)
		if t.info {
			verdict = "(not a target)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.scenario, t.target, t.measured, verdict)
	}
	return b.String()
}

func newFigures() *figures {
	return &figures{uncontended: map[int]map[*contender]float64{}, hot: map[*contender]hotRow{}}
}

// colorOf gives each contender one colour in every panel: dlock blue, peers warm, raw floors grey.
func colorOf(c *contender) color.Color {
	switch c.name {
	case "dlock (rueidis)":
		return color.RGBA{R: 0x1f, G: 0x4e, B: 0xb4, A: 0xff}
	case "dlock (go-redis)":
		return color.RGBA{R: 0x6f, G: 0x9b, B: 0xe8, A: 0xff}
	case "redsync":
		return color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	case "redislock":
		return color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	case "rueidislock":
		return color.RGBA{R: 0x9c, G: 0x6b, B: 0x1f, A: 0xff}
	case "raw go-redis":
		return color.RGBA{R: 0xb0, G: 0xb0, B: 0xb0, A: 0xff}
	case "raw rueidis":
		return color.RGBA{R: 0x80, G: 0x80, B: 0x80, A: 0xff}
	default:
		return color.RGBA{R: 0x50, G: 0x50, B: 0x50, A: 0xff}
	}
}

// writePlot draws scenario 1 (pairs/s by goroutines, every contender) on top and scenario 2
// (handoffs/s and Jain's index, every lock) below, into dir/plotFile. It returns the file's path.
func writePlot(dir string, f *figures, subtitle string) (string, error) {
	if len(f.uncontended) == 0 && len(f.hot) == 0 {
		return "", fmt.Errorf("plot: neither scenario 1 nor 2 was run")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	const w, h = 10 * vg.Inch, 8 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	top := draw.Crop(dc, 0, 0, h/2, 0)
	bottom := draw.Crop(dc, 0, 0, 0, -h/2)
	if p, err := uncontendedPlot(f); err == nil && p != nil {
		p.Title.Text = "dlock beside its peers (" + subtitle + ")\nScenario 1, uncontended: Lock+Unlock pairs/s, median"
		p.Draw(draw.Crop(top, vg.Points(6), -vg.Points(6), vg.Points(4), -vg.Points(4)))
	} else if err != nil {
		return "", err
	}
	left := draw.Crop(bottom, 0, -w/2, 0, 0)
	right := draw.Crop(bottom, w/2, 0, 0, 0)
	if len(f.hot) > 0 {
		p, err := hotRatePlot(f)
		if err != nil {
			return "", err
		}
		p.Draw(draw.Crop(left, vg.Points(6), -vg.Points(4), vg.Points(4), -vg.Points(4)))
		p, err = hotJainPlot(f)
		if err != nil {
			return "", err
		}
		p.Draw(draw.Crop(right, vg.Points(4), -vg.Points(6), vg.Points(4), -vg.Points(4)))
	}
	path := filepath.Join(dir, plotFile)
	out, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return "", err
	}
	return path, out.Close()
}

func uncontendedPlot(f *figures) (*plot.Plot, error) {
	if len(f.uncontended) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Y.Label.Text = "pairs/s"
	p.Y.Min = 0
	var labels []string
	for _, g := range f.uncontendedGoroutines {
		labels = append(labels, fmt.Sprintf("%d goroutine%s", g, plural(g)))
	}
	p.NominalX(labels...)
	bw := vg.Points(13)
	n := len(contenders)
	var top float64
	for i, c := range contenders {
		vals := make(plotter.Values, len(f.uncontendedGoroutines))
		for j, g := range f.uncontendedGoroutines {
			vals[j] = f.uncontended[g][c]
			top = max(top, vals[j])
		}
		b, err := plotter.NewBarChart(vals, bw)
		if err != nil {
			return nil, err
		}
		b.Color = colorOf(c)
		b.LineStyle.Width = 0
		b.Offset = vg.Length(float64(i)-float64(n-1)/2) * bw
		p.Add(b)
		p.Legend.Add(c.name, b)
		if err := missing(p, vals, b.Offset); err != nil {
			return nil, err
		}
	}
	p.Y.Tick.Marker = thousandsTicks
	p.Y.Max = top * 1.08
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())
	return p, nil
}

// thousandsTicks labels an axis's major ticks as integers with comma separators.
var thousandsTicks = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = thousands(ticks[i].Value)
		}
	}
	return ticks
})

// missing marks, with a small "failed" at the foot of where its bar would be, each value of
// vals that is zero (a contender that failed every repetition).
func missing(p *plot.Plot, vals plotter.Values, offset vg.Length) error {
	var xys plotter.XYs
	var labels []string
	for i, v := range vals {
		if v == 0 {
			xys = append(xys, plotter.XY{X: float64(i), Y: 0})
			labels = append(labels, "failed")
		}
	}
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
	if err != nil {
		return err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(6)
		l.TextStyle[i].Rotation = 1.5708
		l.TextStyle[i].XAlign = -0.5
	}
	l.Offset = vg.Point{X: offset + vg.Points(3), Y: vg.Points(2)}
	p.Add(l)
	return nil
}

// shortName breaks a contender's name over two lines for an axis label.
func shortName(c *contender) string {
	return strings.Replace(c.name, " (", "\n(", 1)
}

func hotRatePlot(f *figures) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Scenario 2, one hot name, 64 goroutines:\nhandoffs/s, median"
	p.Y.Label.Text = "handoffs/s"
	p.Y.Min = 0
	var names []string
	all := make(plotter.Values, len(f.hotLocks))
	other := make(plotter.Values, len(f.hotLocks))
	for i, c := range f.hotLocks {
		names = append(names, shortName(c))
		all[i], other[i] = f.hot[c].rate, f.hot[c].changes
		p.Y.Max = max(p.Y.Max, all[i]*1.15)
	}
	p.NominalX(names...)
	p.X.Tick.Label.Font.Size = vg.Points(8)
	bw := vg.Points(16)
	b1, err := plotter.NewBarChart(all, bw)
	if err != nil {
		return nil, err
	}
	b1.Color = color.RGBA{R: 0x9e, G: 0xb9, B: 0xe0, A: 0xff}
	b1.LineStyle.Width = 0
	b1.Offset = -bw / 2
	b2, err := plotter.NewBarChart(other, bw)
	if err != nil {
		return nil, err
	}
	b2.Color = color.RGBA{R: 0x1f, G: 0x4e, B: 0xb4, A: 0xff}
	b2.LineStyle.Width = 0
	b2.Offset = bw / 2
	p.Add(plotter.NewGrid(), b1, b2)
	p.Y.Tick.Marker = thousandsTicks
	if err := missing(p, all, 0); err != nil {
		return nil, err
	}
	p.Legend.Add("all handoffs", b1)
	p.Legend.Add("to another goroutine", b2)
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	return p, nil
}

func hotJainPlot(f *figures) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Scenario 2: Jain's fairness index over\nthe goroutines' acquisitions (1 = even)"
	p.Y.Min, p.Y.Max = 0, 1.08
	var names []string
	for _, c := range f.hotLocks {
		names = append(names, shortName(c))
	}
	p.NominalX(names...)
	p.X.Tick.Label.Font.Size = vg.Points(8)
	bw := vg.Points(22)
	for i, c := range f.hotLocks {
		vals := make(plotter.Values, len(f.hotLocks))
		vals[i] = f.hot[c].jain
		b, err := plotter.NewBarChart(vals, bw)
		if err != nil {
			return nil, err
		}
		b.Color = colorOf(c)
		b.LineStyle.Width = 0
		p.Add(b)
	}
	target := plotter.NewFunction(func(float64) float64 { return 0.9 })
	target.Color = color.Black
	target.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(plotter.NewGrid(), target)
	p.Legend.Add("target 0.9", target)
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	return p, nil
}
