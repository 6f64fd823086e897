package console

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/cmd/sluice/internal/human"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// sample is one reading of the outbox's lag.
type sample struct {
	At          time.Time
	Pending     int64
	OldestAge   time.Duration
	Quarantined int64
}

// samples keeps the newest readings, up to a capacity, oldest first: the lag chart's data. It
// is read by page handlers while the sampler adds to it.
type samples struct {
	mu   sync.Mutex
	buf  []sample
	next int // where the next sample goes once buf is full
	cap  int
}

func newSamples(capacity int) *samples {
	return &samples{cap: max(capacity, 2)}
}

// add appends s, dropping the oldest sample once full.
func (x *samples) add(s sample) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.buf) < x.cap {
		x.buf = append(x.buf, s)
		return
	}
	x.buf[x.next] = s
	x.next = (x.next + 1) % x.cap
}

// since returns the samples taken at or after t, oldest first.
func (x *samples) since(t time.Time) []sample {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]sample, 0, len(x.buf))
	for i := range x.buf {
		s := x.buf[(x.next+i)%len(x.buf)]
		if !s.At.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

// sample reads the outbox's lag once; a failure is logged and leaves a gap in the chart.
func (s *Server) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.SampleEvery)
	defer cancel()
	lag, err := outbox.LagOf(ctx, s.cfg.DB)
	if err != nil {
		if ctx.Err() == nil {
			s.cfg.Logger.Warn("console: sample the outbox lag", "error", err)
		}
		return
	}
	s.samples.add(sample{At: time.Now(), Pending: lag.Pending, OldestAge: lag.OldestPendingAge, Quarantined: lag.Quarantined})
}

// chart is an inline SVG line chart of one figure over the chart's window.
type chart struct {
	Title string
	// Points is the polyline's points attribute; empty without samples.
	Points string
	// Max labels the top of the y axis; Last is the newest value.
	Max, Last string
	Samples   int
	Width     int
	Height    int
}

// Chart geometry, in SVG user units.
const (
	chartWidth  = 600
	chartHeight = 120
)

// lagChart plots value over the window ending at now, each sample at its time.
func lagChart(title string, ss []sample, now time.Time, value func(sample) float64, format func(float64) string) chart {
	c := chart{Title: title, Samples: len(ss), Width: chartWidth, Height: chartHeight, Max: format(0), Last: "-"}
	if len(ss) == 0 {
		return c
	}
	top := 0.0
	for _, s := range ss {
		top = max(top, value(s))
	}
	c.Max, c.Last = format(top), format(value(ss[len(ss)-1]))
	if top == 0 {
		top = 1
	}
	start := now.Add(-ChartWindow)
	var b strings.Builder
	for i, s := range ss {
		x := float64(s.At.Sub(start)) / float64(ChartWindow) * chartWidth
		y := chartHeight - value(s)/top*(chartHeight-4) - 2
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(min(max(x, 0), chartWidth), 'f', 1, 64))
		b.WriteByte(',')
		b.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
	}
	c.Points = b.String()
	return c
}

func formatCount(v float64) string { return fmt.Sprintf("%.0f", v) }

func formatSeconds(v float64) string {
	return human.Duration(time.Duration(v * float64(time.Second)))
}

// reading is the last reading of a source the sampler reads (Config.Queues, Config.LagHistory):
// the sampler writes it, pages read it.
type reading[T any] struct {
	mu  sync.Mutex
	at  time.Time
	v   T
	err error
}

// set records a reading at at; a failed one keeps the last value read.
func (r *reading[T]) set(at time.Time, v T, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at, r.err = at, err
	if err == nil {
		r.v = v
	}
}

// get returns the value of the last reading that succeeded, when the last reading was taken,
// and its error.
func (r *reading[T]) get() (T, time.Time, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.v, r.at, r.err
}

// readQueues reads Config.Queues once, when set.
func (s *Server) readQueues(ctx context.Context) {
	if s.cfg.Queues == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(s.cfg.SampleEvery, 10*time.Second))
	defer cancel()
	qs, err := s.cfg.Queues(ctx)
	if err != nil && ctx.Err() == nil {
		s.cfg.Logger.Warn("console: read the queues", "error", err)
	}
	s.queues.set(time.Now(), qs, err)
}

// readHistory reads Config.LagHistory over the chart's window, when set and due (at start, then
// every LagHistoryEvery).
func (s *Server) readHistory(ctx context.Context) {
	if s.cfg.LagHistory == nil {
		return
	}
	if _, at, _ := s.history.get(); !at.IsZero() && time.Since(at) < LagHistoryEvery {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(s.cfg.SampleEvery, 10*time.Second))
	defer cancel()
	now := time.Now()
	ps, err := s.cfg.LagHistory(ctx, now.Add(-ChartWindow), now)
	if err != nil && ctx.Err() == nil {
		s.cfg.Logger.Warn("console: read the lag history", "source", s.cfg.LagHistorySource, "error", err)
	}
	s.history.set(now, ps, err)
}

// chartSamples returns the samples the lag charts show since t, and says where they come from:
// the lag history (Config.LagHistory) when its last reading has points, else the console's own
// samples, with why.
func (s *Server) chartSamples(t time.Time) (ss []sample, source, note string) {
	own := func() []sample { return s.samples.since(t) }
	if s.cfg.LagHistory == nil {
		return own(), "", ""
	}
	ps, at, err := s.history.get()
	switch {
	case at.IsZero():
		return own(), "", s.cfg.LagHistorySource + " not read yet: the console's own samples meanwhile."
	case err != nil:
		return own(), "", s.cfg.LagHistorySource + " could not be read (" + strings.Join(strings.Fields(err.Error()), " ") + "): the console's own samples meanwhile."
	}
	for _, p := range ps {
		if !p.At.Before(t) {
			ss = append(ss, sample{At: p.At, Pending: p.Pending, OldestAge: p.OldestAge})
		}
	}
	if len(ss) == 0 {
		return own(), "", s.cfg.LagHistorySource + " has no datapoints in the last hour: the console's own samples meanwhile."
	}
	return ss, s.cfg.LagHistorySource, ""
}
