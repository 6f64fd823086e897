package metrics

import (
	"context"
	"encoding/json"
	"io"
	"sort"
	"sync"
	"time"
)

// maxEMFValues is EMF's limit of values of one metric in one line.
const maxEMFValues = 100

// EMF is the Recorder that writes CloudWatch metrics as Embedded Metric Format log lines: one
// JSON object per Record call (per 100 samples of a histogram beyond the first 100) that
// CloudWatch Logs turns into metrics in the Namespace namespace, so no PutMetricData call is
// ever made. In a Lambda, write to os.Stdout.
//
// Kinds do not change the line: CloudWatch aggregates every metric into statistics (Sum for a
// counter, Maximum or Average for a gauge, percentiles for a histogram) when it is read.
type EMF struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
}

var _ Recorder = (*EMF)(nil)

// NewEMF returns an EMF recorder writing to w. A nil w discards everything.
func NewEMF(w io.Writer) *EMF {
	if w == nil {
		w = io.Discard
	}
	return &EMF{w: w, now: time.Now}
}

type metricDef struct {
	Name string `json:"Name"`
	Unit Unit   `json:"Unit"`
}

type directive struct {
	Namespace  string      `json:"Namespace"`
	Dimensions [][]string  `json:"Dimensions"`
	Metrics    []metricDef `json:"Metrics"`
}

type metadata struct {
	Timestamp         int64       `json:"Timestamp"`
	CloudWatchMetrics []directive `json:"CloudWatchMetrics"`
}

// Record implements Recorder: it writes one line holding every measurement of ms with dims as
// the line's dimensions. A histogram with more than 100 samples continues on further lines
// that hold only the remaining samples (EMF's limit is 100 values per metric and line).
func (l *EMF) Record(_ context.Context, dims Dimensions, ms ...Measurement) {
	if l == nil {
		return
	}
	rest := make([][]float64, len(ms))
	first := true
	for {
		var line []Measurement
		for i, m := range ms {
			switch {
			case first && len(m.Samples) == 0:
				line = append(line, m)
			case first:
				n := min(len(m.Samples), maxEMFValues)
				m.Samples, rest[i] = m.Samples[:n], m.Samples[n:]
				line = append(line, m)
			case len(rest[i]) > 0:
				n := min(len(rest[i]), maxEMFValues)
				m.Samples, rest[i] = rest[i][:n], rest[i][n:]
				line = append(line, m)
			}
		}
		first = false
		if len(line) == 0 {
			return
		}
		l.emit(dims, line)
	}
}

// emit writes one line of ms, which fit EMF's limits.
func (l *EMF) emit(dims Dimensions, ms []Measurement) {
	line := make(map[string]any, len(dims)+len(ms)+1)
	dimNames := make([]string, 0, len(dims))
	for k, v := range dims {
		line[k] = v
		dimNames = append(dimNames, k)
	}
	sort.Strings(dimNames)
	defs := make([]metricDef, 0, len(ms))
	for _, m := range ms {
		defs = append(defs, metricDef{Name: m.Name, Unit: m.Unit})
		if len(m.Samples) > 0 {
			line[m.Name] = m.Samples
		} else {
			line[m.Name] = m.Value
		}
	}
	line["_aws"] = metadata{
		Timestamp:         l.now().UnixMilli(),
		CloudWatchMetrics: []directive{{Namespace: Namespace, Dimensions: [][]string{dimNames}, Metrics: defs}},
	}
	b, err := json.Marshal(line)
	if err != nil {
		return
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(b)
}
