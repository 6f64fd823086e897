// Package otelmetrics is the OpenTelemetry implementation of metrics.Recorder: sluice's
// measurements become instruments of an OpenTelemetry meter (counters, gauges and histograms
// named as in pkg/metrics, dimensions as attributes), exported by whatever MeterProvider the
// program configures (OTLP to a collector, Prometheus, ...).
//
//	rec := otelmetrics.New(otel.GetMeterProvider())
//	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{..., MetricsRecorder: rec})
//
// It depends on the OpenTelemetry metric API only; the SDK is the program's choice.
package otelmetrics

import (
	"context"
	"sort"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/pkg/metrics"
)

// ScopeName is the instrumentation scope of sluice's meter.
const ScopeName = "github.com/sluicehq/sluice"

// Recorder records sluice's measurements on an OpenTelemetry meter. Safe for concurrent use.
type Recorder struct {
	meter metric.Meter
	mu    sync.Mutex
	insts map[instKey]instrument
	// onError receives instrument creation errors; the measurement is dropped.
	onError func(error)
}

// instrument is one created instrument. The kind decides which field is set: the SDK's
// instruments implement several instrument interfaces at once, so a type switch cannot tell.
type instrument struct {
	counter   metric.Float64Counter
	gauge     metric.Float64Gauge
	histogram metric.Float64Histogram
}

type instKey struct {
	name string
	kind metrics.Kind
}

var _ metrics.Recorder = (*Recorder)(nil)

// New returns a Recorder on mp's meter for sluice (scope ScopeName). Pass
// otel.GetMeterProvider() to use the global provider.
func New(mp metric.MeterProvider) *Recorder {
	return &Recorder{meter: mp.Meter(ScopeName), insts: map[instKey]instrument{}, onError: func(error) {}}
}

// Unit returns the UCUM unit OpenTelemetry uses for u: "1" for a count, "s", "ms", "By".
func Unit(u metrics.Unit) string {
	switch u {
	case metrics.Seconds:
		return "s"
	case metrics.Milliseconds:
		return "ms"
	case metrics.Bytes:
		return "By"
	}
	return "1"
}

// Record implements metrics.Recorder: a Counter adds its Value (negative values are dropped,
// counters only grow), a Gauge records its Value, a Histogram records each sample (or Value
// when there are none). Dimensions become the attributes of every measurement.
func (r *Recorder) Record(ctx context.Context, dims metrics.Dimensions, ms ...metrics.Measurement) {
	if len(ms) == 0 {
		return
	}
	opt := metric.WithAttributeSet(attributes(dims))
	for _, m := range ms {
		inst, err := r.instrument(m)
		if err != nil {
			r.onError(err)
			continue
		}
		switch {
		case inst.counter != nil:
			if m.Value >= 0 {
				inst.counter.Add(ctx, m.Value, opt)
			}
		case inst.gauge != nil:
			inst.gauge.Record(ctx, m.Value, opt)
		case inst.histogram != nil:
			if len(m.Samples) == 0 {
				inst.histogram.Record(ctx, m.Value, opt)
			}
			for _, v := range m.Samples {
				inst.histogram.Record(ctx, v, opt)
			}
		}
	}
}

func (r *Recorder) instrument(m metrics.Measurement) (instrument, error) {
	k := instKey{m.Name, m.Kind}
	r.mu.Lock()
	defer r.mu.Unlock()
	if inst, ok := r.insts[k]; ok {
		return inst, nil
	}
	var (
		inst instrument
		err  error
		unit = metric.WithUnit(Unit(m.Unit))
	)
	switch m.Kind {
	case metrics.Gauge:
		inst.gauge, err = r.meter.Float64Gauge(m.Name, unit)
	case metrics.Histogram:
		inst.histogram, err = r.meter.Float64Histogram(m.Name, unit)
	default:
		inst.counter, err = r.meter.Float64Counter(m.Name, unit)
	}
	if err != nil {
		return instrument{}, err
	}
	r.insts[k] = inst
	return inst, nil
}

func attributes(dims metrics.Dimensions) attribute.Set {
	if len(dims) == 0 {
		return *attribute.EmptySet()
	}
	kvs := make([]attribute.KeyValue, 0, len(dims))
	for k, v := range dims {
		kvs = append(kvs, attribute.String(k, v))
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].Key < kvs[j].Key })
	return attribute.NewSet(kvs...)
}
