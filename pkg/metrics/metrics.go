// Package metrics is how sluice's relay and inbox report what they do: a Recorder interface
// small enough to put in front of any backend, the one definition of every metric ([Metric]:
// name, kind, unit, dimensions and meaning; [All] lists them), which the relay and the inbox
// emit, the CDK alarms and dashboard watch and docs/deploy.md tabulates, and the
// CloudWatch Embedded Metric Format implementation the Lambdas use. An OpenTelemetry meter
// implementation is in the otelmetrics subpackage, which keeps OpenTelemetry out of the module
// graph of programs that only write EMF.
//
// A component calls Record with a batch of measurements that belong together (the relay's
// heartbeat and lag every MetricsInterval; a consumer's counts and latencies per SQS batch), so
// EMF writes them as one log line, as it always did.
package metrics

import "context"

// Unit is a metric's unit, as CloudWatch names it.
type Unit string

// The units sluice uses.
const (
	Count        Unit = "Count"
	Seconds      Unit = "Seconds"
	Milliseconds Unit = "Milliseconds"
	Bytes        Unit = "Bytes"
)

// Kind says how a backend aggregates a measurement.
type Kind int

const (
	// Counter: Value is an increment (a number of events since the last Record). The default.
	Counter Kind = iota
	// Gauge: Value is the current value of something (a queue length, an age).
	Gauge
	// Histogram: Samples (or Value, when Samples is empty) are observations of a distribution
	// (latencies).
	Histogram
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	case Histogram:
		return "histogram"
	}
	return "Kind(?)"
}

// Measurement is one named value, or several observations of one histogram.
type Measurement struct {
	// Name is the Name of one of this package's metrics, e.g. InboxProcessed.Name.
	Name string
	// Kind is Counter, Gauge or Histogram.
	Kind Kind
	// Unit is the value's unit.
	Unit Unit
	// Value is a counter's increment, a gauge's value, or one histogram observation. A zero is
	// a data point (alarms on missing data rely on it).
	Value float64
	// Samples are a histogram's observations; when set, Value is ignored.
	Samples []float64
}

// Dimensions name what a measurement is about, e.g. {Service: consumer, Consumer: ledger}.
type Dimensions map[string]string

// Recorder receives measurements. Implementations must be safe for concurrent use, must not
// keep dims or ms after Record returns, and should not block: Record runs on the relay's and
// the consumer's paths (once per metrics interval, once per SQS batch).
type Recorder interface {
	// Record records ms, every one with the dimensions dims, as one unit.
	Record(ctx context.Context, dims Dimensions, ms ...Measurement)
}

// Tee returns a Recorder that records to each of rs in turn, skipping nil ones; nil when none
// is left (so that callers can test for "no metrics" with == nil).
func Tee(rs ...Recorder) Recorder {
	var out tee
	for _, r := range rs {
		if r != nil {
			out = append(out, r)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return out
}

type tee []Recorder

func (t tee) Record(ctx context.Context, dims Dimensions, ms ...Measurement) {
	for _, r := range t {
		r.Record(ctx, dims, ms...)
	}
}
