package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

type ackAll struct{}

func (ackAll) PublishBatch(_ context.Context, _ string, events []*Event) []error {
	return make([]error, len(events))
}

// BenchmarkTracingPublisher is the relay's tracing work per PublishBatch call of 10 events with
// a recording provider (every span sampled, batch processor): one span, ten extracted links.
func BenchmarkTracingPublisher(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	p := tracePublisher(ackAll{}, tp, nil)
	events := make([]*Event, 10)
	for i := range events {
		events[i] = &Event{ID: int64(i), EventID: uuid.New(), CreatedAt: time.Now(),
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p.PublishBatch(ctx, "arn:aws:sns:us-east-1:000000000000:orders", events)
	}
}

func TestDestinationName(t *testing.T) {
	t.Parallel()
	for dest, want := range map[string][2]string{
		"arn:aws:sns:us-east-1:000000000000:orders":            {"orders", "aws.sns"},
		"arn:aws:sns:us-east-1:000000000000:orders.fifo":       {"orders.fifo", "aws.sns"},
		"arn:aws:events:us-east-1:000000000000:event-bus/shop": {"shop", "aws.eventbridge"},
		"arn:aws:kinesis:us-east-1:000000000000:stream/clicks": {"clicks", "aws.kinesis"},
		"kafka://orders": {"orders", "kafka"},
		"somewhere":      {"somewhere", "unknown"},
	} {
		name, system := destinationName(dest)
		if name != want[0] || system.Value.AsString() != want[1] {
			t.Errorf("%s: got %s, %s; want %v", dest, name, system.Value.AsString(), want)
		}
	}
}
