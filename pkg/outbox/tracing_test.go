package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// tracing is an SDK tracer provider that samples everything into an in-memory exporter.
func tracing(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func traceMsg(i int, headers map[string]string) outbox.Message {
	return outbox.Message{Topic: testTopic, AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "OrderCreated",
		Payload: json.RawMessage(`{}`), Headers: headers}
}

func TestWriteInjectsTheActiveSpanContext(t *testing.T) {
	t.Parallel()
	tp, _ := tracing(t)
	ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
	defer span.End()
	sc := span.SpanContext()
	wantTP := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())

	t.Run("injected", func(t *testing.T) {
		got, err := outbox.QueueContext(ctx, &pgx.Batch{}, traceMsg(1, nil), traceMsg(2, map[string]string{"tenant": "t1"}))
		require.NoError(t, err)
		require.Equal(t, wantTP, got[0].Headers["traceparent"])
		require.Equal(t, map[string]string{"tenant": "t1", "traceparent": wantTP}, got[1].Headers, "the caller's headers are kept")
	})
	t.Run("the caller's own trace context wins", func(t *testing.T) {
		own := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
		got, err := outbox.QueueContext(ctx, &pgx.Batch{}, traceMsg(1, own))
		require.NoError(t, err)
		require.Equal(t, own, got[0].Headers)
	})
	t.Run("no room: written without it, not refused", func(t *testing.T) {
		full := map[string]string{}
		for i := range outbox.MaxWriteAttributes - 5 {
			full[fmt.Sprintf("h%d", i)] = "v"
		}
		got, err := outbox.QueueContext(ctx, &pgx.Batch{}, traceMsg(1, full))
		require.NoError(t, err)
		require.Equal(t, full, got[0].Headers)
		_, err = outbox.QueueContext(ctx, &pgx.Batch{}, traceMsg(1, map[string]string{"h0": "v", "h1": "v", "h2": "v", "h3": "v", "h4": "v"}))
		require.ErrorIs(t, err, outbox.ErrInvalidMessage, "the caller's own headers still count against the limit")
		// Three headers leave room for exactly one injected one (one attribute stays free for
		// the claim check's ExtendedPayloadSize).
		got, err = outbox.QueueContext(ctx, &pgx.Batch{}, traceMsg(1, map[string]string{"h0": "v", "h1": "v", "h2": "v"}))
		require.NoError(t, err)
		require.Equal(t, wantTP, got[0].Headers["traceparent"])
	})
	t.Run("no span, no headers", func(t *testing.T) {
		got, err := outbox.QueueContext(context.Background(), &pgx.Batch{}, traceMsg(1, nil))
		require.NoError(t, err)
		require.Empty(t, got[0].Headers)
		got, err = outbox.Queue(&pgx.Batch{}, traceMsg(1, nil))
		require.NoError(t, err)
		require.Empty(t, got[0].Headers, "Queue has no context")
	})
	t.Run("propagation off", func(t *testing.T) {
		w, err := outbox.NewWriter(outbox.WriterConfig{Propagator: propagation.NewCompositeTextMapPropagator()})
		require.NoError(t, err)
		got, err := w.QueueContext(ctx, &pgx.Batch{}, traceMsg(1, nil))
		require.NoError(t, err)
		require.Empty(t, got[0].Headers)
	})
	t.Run("the caller's map is not modified", func(t *testing.T) {
		h := map[string]string{"tenant": "t1"}
		_, err := outbox.QueueContext(ctx, &pgx.Batch{}, traceMsg(1, h))
		require.NoError(t, err)
		require.Equal(t, map[string]string{"tenant": "t1"}, h)
	})
}

func TestWriteStoresTheTraceparentInTheRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, _ := tracing(t)
	ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := outbox.Write(ctx, tx, traceMsg(1, nil))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	span.End()
	var headers map[string]string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT headers FROM outbox_event WHERE event_id = $1`, written[0].EventID).Scan(&headers))
	require.Equal(t, fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID()), headers["traceparent"])
}

func TestWriteWithoutSpanAllocatesNoMoreThanBefore(t *testing.T) {
	msgs := []outbox.Message{traceMsg(1, nil)}
	ctx := context.Background()
	base := testing.AllocsPerRun(200, func() { _, _ = outbox.Queue(&pgx.Batch{}, msgs...) })
	withCtx := testing.AllocsPerRun(200, func() { _, _ = outbox.QueueContext(ctx, &pgx.Batch{}, msgs...) })
	require.Equal(t, base, withCtx, "no span in ctx: injection costs nothing")
}

// TestRelayRecordsAPublishSpanLinkedToEachWriter writes events in two traces and one without
// any, relays them with a failing entry, and checks the publish spans: one per PublishBatch
// call, linked to each event's writer span, with the outbox wait and the failure recorded.
func TestRelayRecordsAPublishSpanLinkedToEachWriter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, exp := tracing(t)
	ctx := context.Background()

	var writers []trace.SpanContext
	var written []outbox.Message
	for i := range 3 {
		wctx, span := tp.Tracer("test").Start(ctx, "place order")
		if i == 2 {
			wctx = ctx // the third is written outside any span
		}
		tx, err := b.pool.Begin(wctx)
		require.NoError(t, err)
		w, err := outbox.Write(wctx, tx, traceMsg(i, nil))
		require.NoError(t, err)
		require.NoError(t, tx.Commit(wctx))
		span.End()
		writers = append(writers, span.SpanContext())
		written = append(written, w...)
	}
	failing := written[1].EventID
	b.rec.setFail(func(e *outbox.Event) error {
		if e.EventID == failing {
			return outbox.Permanent(errors.New("InvalidParameter: too big"))
		}
		return nil
	})
	exp.Reset()
	r := b.relay(t, func(c *outbox.RelayConfig) { c.TracerProvider = tp })
	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Published)
	require.Equal(t, 1, st.Quarantined)

	spans := exp.GetSpans()
	require.NotEmpty(t, spans)
	linked := map[string]tracetest.SpanStub{} // event id -> the publish span that carried it and acknowledged it or not
	failed := map[string]bool{}
	for _, s := range spans {
		require.Equal(t, "publish orders", s.Name)
		require.Equal(t, trace.SpanKindProducer, s.SpanKind)
		attrs := map[string]any{}
		for _, a := range s.Attributes {
			attrs[string(a.Key)] = a.Value.AsInterface()
		}
		require.Equal(t, "aws.sns", attrs["messaging.system"])
		require.Equal(t, "send", attrs["messaging.operation.type"])
		require.Equal(t, testARN, attrs["aws.sns.topic.arn"])
		require.EqualValues(t, len(s.Links), attrs["messaging.batch.message_count"])
		for _, l := range s.Links {
			la := map[string]any{}
			for _, a := range l.Attributes {
				la[string(a.Key)] = a.Value.AsInterface()
			}
			id := la["messaging.message.id"].(string)
			require.Contains(t, la, wire.SpanOutboxWaitMillis)
			require.GreaterOrEqual(t, la[wire.SpanOutboxWaitMillis].(int64), int64(0))
			linked[id] = s
			for i, w := range written {
				if w.EventID.String() == id {
					if i == 2 {
						require.False(t, l.SpanContext.IsValid(), "an event written outside a span has no context to link")
					} else {
						require.Equal(t, writers[i].TraceID(), l.SpanContext.TraceID(), "linked to its writer's trace")
						require.Equal(t, writers[i].SpanID(), l.SpanContext.SpanID(), "linked to its writer's span")
					}
				}
			}
		}
		for _, ev := range s.Events {
			if ev.Name == "publish failed" {
				for _, a := range ev.Attributes {
					if a.Key == "messaging.message.id" {
						failed[a.Value.AsString()] = true
					}
				}
				require.Equal(t, codes.Error, s.Status.Code)
			}
		}
	}
	for _, w := range written {
		require.Contains(t, linked, w.EventID.String(), "every event is in a publish span")
	}
	require.Equal(t, map[string]bool{failing.String(): true}, failed, "the failure is recorded on its entry")
}

// A 500-record Kinesis or Kafka call keeps a link to every writer's span, although the SDK
// keeps 128 links a span by default: the links beyond go on child spans of the call, and no
// span carries more than the SDK keeps (issue 21, item 8).
func TestPublishSpansKeepEveryLinkOfALargeCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tp, exp := tracing(t)
	const n = 300
	writers := map[trace.SpanID]bool{}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	for i := range n {
		wctx, span := tp.Tracer("orders").Start(ctx, "place order")
		_, err := outbox.Write(wctx, tx, outbox.Message{Topic: "clicks", EventType: "Clicked", PartitionKey: fmt.Sprintf("k%d", i), Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		span.End()
		writers[span.SpanContext().SpanID()] = true
	}
	require.NoError(t, tx.Commit(ctx))
	svc := &sizedServices{limits: outbox.MessageLimits{}.WithDefaults(), accepted: map[string]string{}}
	stream := "arn:aws:kinesis:us-east-1:111122223333:stream/clicks"
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewKinesisPublisher(svc)
		c.Topics = map[string]string{"clicks": stream}
		c.BatchSize, c.TracerProvider = 500, tp
	})
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	linked := map[trace.SpanID]bool{}
	for _, s := range exp.GetSpans() {
		if s.Name != "publish clicks" {
			continue
		}
		require.LessOrEqual(t, len(s.Links), outbox.MaxLinksPerSpan, "no span holds more links than the SDK keeps")
		require.Zero(t, s.DroppedLinks, "no link dropped")
		require.Equal(t, "aws.kinesis", attrValue(s, "messaging.system"))
		for _, l := range s.Links {
			linked[l.SpanContext.SpanID()] = true
		}
	}
	for w := range writers {
		require.True(t, linked[w], "every writer's span is linked from its publish call")
	}
}

func attrValue(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}
