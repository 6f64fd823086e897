package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestParseAWSTraceHeader(t *testing.T) {
	t.Parallel()
	sc, ok := parseAWSTraceHeader("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1;Lineage=a87bd80c:1")
	require.True(t, ok)
	require.Equal(t, "5759e988bd862e3fe1be46a994272793", sc.TraceID().String())
	require.Equal(t, "53995c3f42cd8ad8", sc.SpanID().String())
	require.True(t, sc.IsSampled())
	require.True(t, sc.IsRemote())
	for _, bad := range []string{"", "Root=1-5759e988-bd862e3fe1be46a994272793", "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
		"Root=1-zz59e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=5399"} {
		_, ok := parseAWSTraceHeader(bad)
		require.False(t, ok, bad)
	}
}

// BenchmarkRecordSpan is the consumer's per-record tracing work with a recording provider
// (every span sampled, batch processor): what the tracing suite of bench/ sees per record.
func BenchmarkRecordSpan(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := newTracing(tp, defaultPropagator, "bench", "per-record", false)
	msg := Message{ID: "0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f4a5b", EventType: "OrderCreated", CreatedAt: time.Now(), Payload: []byte(`{"a":1}`),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, span := tr.start(ctx, msg, "", "arn:aws:sqs:us-east-1:000000000000:q", time.Now())
		tr.end(span, msg, Applied, nil, time.Now())
	}
	_ = trace.SpanKindConsumer
}
