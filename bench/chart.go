package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
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
