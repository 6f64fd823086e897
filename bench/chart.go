package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chartContenders are the relay chart's groups, left to right.
var chartContenders = []struct{ name, label string }{
	{nameCeiling4, "ceiling\n4 workers"},
	{nameCeiling1, "ceiling\n1 worker"},
	{nameSluice1, "sluice\n1 relay"},
	{nameSluice4, "sluice\n4 relays"},
	{nameTextbook, "textbook\nrelay"},
	{nameWatermill, "watermill\nforwarder"},
}

// writeChart draws the relay throughput of every contender at 0 ms and 10 ms publisher delay
// as bars on a logarithmic axis (the contenders span four orders of magnitude) into a PNG.
func writeChart(path string, rep *Report) error {
	if len(rep.Relay) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Relay throughput, %d pending rows in %d keys (same run, same PostgreSQL)", rep.Sizes.RelayRows, rep.Sizes.RelayKeys)
	p.Y.Label.Text = "events/s (log scale)"
	p.Legend.Top = true
	p.Legend.Left = false

	maxExp := 1.0
	var delays = []struct {
		ms    int
		color color.Color
	}{{0, color.RGBA{R: 31, G: 119, B: 180, A: 255}}, {10, color.RGBA{R: 255, G: 127, B: 14, A: 255}}}
	w := vg.Points(22)
	for i, d := range delays {
		vals := make(plotter.Values, len(chartContenders))
		for j, c := range chartContenders {
			if r, ok := rep.relay(c.name, d.ms); ok && r.Rate() > 1 {
				vals[j] = math.Log10(r.Rate())
				maxExp = math.Max(maxExp, vals[j])
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = d.color
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(float64(i)-0.5) * w
		p.Add(bars)
		// Value labels above the bars.
		var xys plotter.XYs
		var texts []string
		for j, v := range vals {
			if v > 0 {
				xys = append(xys, plotter.XY{X: float64(j) + (float64(i)-0.5)*0.26, Y: v + 0.05})
				texts = append(texts, humanRate(math.Pow(10, v)))
			}
		}
		if len(xys) > 0 {
			lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
			if err != nil {
				return err
			}
			for k := range lbl.TextStyle {
				lbl.TextStyle[k].XAlign = -0.5
				lbl.TextStyle[k].Font.Size = vg.Points(8)
			}
			p.Add(lbl)
		}
		p.Legend.Add(fmt.Sprintf("publisher delay %d ms per call", d.ms), bars)
	}
	labels := make([]string, len(chartContenders))
	for i, c := range chartContenders {
		labels[i] = c.label
	}
	p.NominalX(labels...)
	p.X.Min, p.X.Max = -0.6, float64(len(chartContenders))-0.4
	top := math.Ceil(maxExp + 0.3)
	p.Y.Min, p.Y.Max = 0, top
	var ticks []plot.Tick
	for e := 0.0; e <= top; e++ {
		ticks = append(ticks, plot.Tick{Value: e, Label: humanCount(math.Pow(10, e))})
		for _, m := range []float64{2, 5} {
			if v := e + math.Log10(m); v < top {
				ticks = append(ticks, plot.Tick{Value: v})
			}
		}
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Add(plotter.NewGrid())
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}

func humanRate(v float64) string {
	if v >= 1e3 {
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func humanCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}

// writeSustainedChart draws the sustained suite's runs, one column per table layout: outbox_event's
// heap, all its indexes and its pending-key index over time (top), and the relay's claim, sweep
// and settle medians per sample window (bottom, log scale); blue without and red with VACUUM
// held back.
func writeSustainedChart(path string, rep *Report) error {
	s := rep.Sustained
	if s == nil || len(s.Runs) == 0 {
		return nil
	}
	var layouts []string
	for _, r := range s.Runs {
		if !slices.Contains(layouts, r.layout()) {
			layouts = append(layouts, r.layout())
		}
	}
	free, held := color.RGBA{R: 31, G: 119, B: 180, A: 255}, color.RGBA{R: 214, G: 39, B: 40, A: 255}
	dashes := [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, {vg.Points(2), vg.Points(2)}}
	grid := make([][]*plot.Plot, 2)
	for _, layout := range layouts {
		sizes := plot.New()
		sizes.Title.Text = fmt.Sprintf("%s: %s events/s, retention %s applied every %s", layout, num(float64(s.Rate)), s.Retention, s.PurgeEvery)
		sizes.X.Label.Text = "minutes into the run"
		sizes.Y.Label.Text = "MiB"
		sizes.Legend.Top, sizes.Legend.Left = true, true
		lat := plot.New()
		lat.Title.Text = layout + ": the relay's statements, median per sample window"
		lat.X.Label.Text = "minutes into the run"
		lat.Y.Label.Text = "ms (log scale)"
		lat.Y.Scale = plot.LogScale{}
		lat.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		lat.Legend.Top, lat.Legend.Left = true, true
		hasLat := false
		var marks []struct {
			at  time.Duration
			c   color.Color
			who string
		}
		for _, run := range s.Runs {
			if run.layout() != layout {
				continue
			}
			c, who := color.Color(free), "VACUUM free"
			if run.HeldBack {
				c, who = held, "held back"
			}
			if run.Warmup > 0 {
				marks = append(marks, struct {
					at  time.Duration
					c   color.Color
					who string
				}{run.Warmup, c, who})
			}
			for j, ser := range []struct {
				name string
				v    func(SizeSample) float64
			}{
				{"heap", func(x SizeSample) float64 { return float64(x.Heap) / (1 << 20) }},
				{"all indexes", func(x SizeSample) float64 { return float64(x.Indexes) / (1 << 20) }},
				{"pending-key index", func(x SizeSample) float64 { return float64(x.Index["outbox_event_pending_key_idx"]) / (1 << 20) }},
			} {
				xys := make(plotter.XYs, len(run.Sizes))
				for k, x := range run.Sizes {
					xys[k] = plotter.XY{X: x.At.Minutes(), Y: ser.v(x)}
				}
				l, err := plotter.NewLine(xys)
				if err != nil {
					return err
				}
				l.Color, l.Dashes, l.Width = c, dashes[j], vg.Points(1.5)
				sizes.Add(l)
				sizes.Legend.Add(who+": "+ser.name, l)
			}
			for j, ser := range []struct {
				name string
				v    func(SizeSample) time.Duration
			}{{"claim (lock + read)", func(x SizeSample) time.Duration { return x.ClaimP50 }}, {"sweep", func(x SizeSample) time.Duration { return x.SweepP50 }},
				{"settle", func(x SizeSample) time.Duration { return x.SettleP50 }}} {
				var xys plotter.XYs
				for _, x := range run.Sizes {
					if d := ser.v(x); d > 0 {
						xys = append(xys, plotter.XY{X: x.At.Minutes(), Y: float64(d) / float64(time.Millisecond)})
					}
				}
				if len(xys) == 0 {
					continue
				}
				l, err := plotter.NewLine(xys)
				if err != nil {
					return err
				}
				l.Color, l.Dashes, l.Width = c, dashes[j], vg.Points(1.5)
				lat.Add(l)
				lat.Legend.Add(who+": "+ser.name, l)
				hasLat = true
			}
		}
		sizes.Add(plotter.NewGrid())
		sizes.Y.Min = 0
		// Where each run's measurement window begins: a dotted vertical line across both plots,
		// drawn once the plots' ranges are known.
		for _, m := range marks {
			for _, p := range []*plot.Plot{sizes, lat} {
				if p == lat && !hasLat {
					continue
				}
				lo, hi := p.Y.Min, p.Y.Max
				if p == lat && lo <= 0 {
					lo = hi / 1000
				}
				l, err := plotter.NewLine(plotter.XYs{{X: m.at.Minutes(), Y: lo}, {X: m.at.Minutes(), Y: hi}})
				if err != nil {
					return err
				}
				l.Color, l.Dashes, l.Width = m.c, []vg.Length{vg.Points(1), vg.Points(3)}, vg.Points(1)
				p.Add(l)
				if p == sizes {
					p.Legend.Add(m.who+": measurement window begins", l)
				}
			}
		}
		if hasLat {
			lat.Add(plotter.NewGrid())
		}
		grid[0] = append(grid[0], sizes)
		grid[1] = append(grid[1], lat)
	}

	width, height := vg.Length(len(layouts))*7*vg.Inch, 9*vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: len(layouts), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4),
		PadRight: vg.Points(8), PadX: vg.Points(16), PadY: vg.Points(12)}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j, p := range grid[i] {
			p.Draw(canvases[i][j])
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
