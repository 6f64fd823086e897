// Package emf writes CloudWatch metrics as Embedded Metric Format log lines: one JSON object
// per line that CloudWatch Logs turns into metrics, so no PutMetricData call is ever made.
package emf

import (
	"encoding/json"
	"io"
	"sort"
	"sync"
	"time"
)

// Namespace is the CloudWatch namespace of every sluice metric.
const Namespace = "Sluice"

// Unit is a CloudWatch metric unit.
type Unit string

// The units sluice uses.
const (
	Count        Unit = "Count"
	Seconds      Unit = "Seconds"
	Milliseconds Unit = "Milliseconds"
)

// Metric is one named value, or up to 100 values of one name (EMF's limit per line).
type Metric struct {
	Name   string
	Unit   Unit
	Value  float64
	Values []float64
}

// Logger writes EMF lines with a fixed set of dimensions.
type Logger struct {
	mu   sync.Mutex
	w    io.Writer
	dims map[string]string
	now  func() time.Time
}

// New returns a Logger writing to w (usually os.Stdout in a Lambda) with the given dimensions,
// e.g. {"Service": "relay"}. A nil w discards everything.
func New(w io.Writer, dims map[string]string) *Logger {
	if w == nil {
		w = io.Discard
	}
	return &Logger{w: w, dims: dims, now: time.Now}
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

// Emit writes one line holding all metrics. Metrics with an empty Values slice and Value 0
// are still written (a zero is a data point, which alarms on missing data rely on).
func (l *Logger) Emit(metrics ...Metric) {
	if l == nil || len(metrics) == 0 {
		return
	}
	line := map[string]any{}
	dimNames := make([]string, 0, len(l.dims))
	for k, v := range l.dims {
		line[k] = v
		dimNames = append(dimNames, k)
	}
	sort.Strings(dimNames)
	defs := make([]metricDef, 0, len(metrics))
	for _, m := range metrics {
		defs = append(defs, metricDef{Name: m.Name, Unit: m.Unit})
		if len(m.Values) > 0 {
			vs := m.Values
			if len(vs) > 100 {
				vs = vs[:100]
			}
			line[m.Name] = vs
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
