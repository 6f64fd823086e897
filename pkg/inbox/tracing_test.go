package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/metrics"
)

// spans is an SDK tracer provider that samples everything into an in-memory exporter.
func spans(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// handlerSpans records, per message id, the span context each handler call saw in its ctx.
type handlerSpans struct {
	mu   sync.Mutex
	seen map[string]trace.SpanContext
}

func (h *handlerSpans) router(consumer string) *inbox.Router {
	r := inbox.NewRouter(inbox.FailUnknown)
	inner := scripted(consumer)
	r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		h.mu.Lock()
		if h.seen == nil {
			h.seen = map[string]trace.SpanContext{}
		}
		h.seen[msg.ID] = trace.SpanContextFromContext(ctx)
		h.mu.Unlock()
		return inner(ctx, tx, msg)
	})
	return r
}

func attrsOf(s tracetest.SpanStub) map[string]any {
	m := map[string]any{}
	for _, a := range s.Attributes {
		m[string(a.Key)] = a.Value.AsInterface()
	}
	return m
}

// byMessage returns the consumer spans by message id; each message id must have exactly the
// given number of spans.
func byMessage(t *testing.T, exp *tracetest.InMemoryExporter) map[string][]tracetest.SpanStub {
	t.Helper()
	out := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.SpanKind != trace.SpanKindConsumer {
			continue
		}
		id, _ := attrsOf(s)["messaging.message.id"].(string)
		out[id] = append(out[id], s)
	}
	return out
}

// tracedRec is rec with the traceparent of a new producer span.
func tracedRec(t *testing.T, tp trace.TracerProvider, id string, s script) (events.SQSMessage, trace.SpanContext) {
	t.Helper()
	_, span := tp.Tracer("producer").Start(context.Background(), "place order "+id)
	span.End()
	sc := span.SpanContext()
	r := rec(id, s)
	tpv := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
	r.MessageAttributes["traceparent"] = events.SQSMessageAttribute{DataType: "String", StringValue: &tpv}
	return r, sc
}

// TestConsumerSpansInEveryMode: each record runs in a consumer span that is a child of its
// writer's span, the handler's ctx carries it, and the span ends with the record's outcome.
func TestConsumerSpansInEveryMode(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		tp, exp := spans(t)
		var hs handlerSpans
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: hs.router("c"), Mode: mode, Logger: quiet, TracerProvider: tp, TraceAsChild: true})
		require.NoError(t, err)

		ok, okProducer := tracedRec(t, tp, "ok", script{N: 1})
		bad, badProducer := tracedRec(t, tp, "bad", script{N: 2, Fail: "error"})
		dup := ok
		dup.MessageId = "sqs-ok-again"
		exp.Reset()
		rep := c.Process(context.Background(), batchOf(ok, dup, bad))
		require.Equal(t, []string{"sqs-ok:applied", "sqs-ok-again:duplicate", "sqs-bad:failed"}, outcomes(rep))

		got := byMessage(t, exp)
		require.Len(t, got["ok"], 2, "one span per record: the delivery and its duplicate")
		require.Len(t, got["bad"], 1)
		outcomesSeen := map[string]bool{}
		for _, s := range got["ok"] {
			require.Equal(t, okProducer.TraceID(), s.SpanContext.TraceID(), "same trace as the writer")
			require.Equal(t, okProducer.SpanID(), s.Parent.SpanID(), "a child of the writer's span")
			require.Equal(t, "process", s.Name, "{operation} {destination}: the record names no queue")
			a := attrsOf(s)
			outcomesSeen[a["sluice.inbox.outcome"].(string)] = true
			require.Equal(t, "aws_sqs", a["messaging.system"])
			require.Equal(t, "process", a["messaging.operation.type"])
			require.Equal(t, "c", a["messaging.consumer.group.name"])
			require.Equal(t, mode.String(), a["sluice.inbox.mode"])
			if a["sluice.inbox.outcome"] == "applied" {
				require.Contains(t, a, "sluice.inbox.commit_to_apply_ms")
				require.Equal(t, s.SpanContext.SpanID(), hs.seen["ok"].SpanID(), "the handler's ctx carries the span")
			}
			require.Equal(t, codes.Unset, s.Status.Code)
		}
		require.Equal(t, map[string]bool{"applied": true, "duplicate": true}, outcomesSeen)
		failed := got["bad"][0]
		require.Equal(t, badProducer.TraceID(), failed.SpanContext.TraceID())
		require.Equal(t, "failed", attrsOf(failed)["sluice.inbox.outcome"])
		require.Equal(t, codes.Error, failed.Status.Code)
		require.NotEmpty(t, failed.Events, "the error is recorded")
	})
}

func TestConsumerSpanFollowsAWSTraceHeader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, exp := spans(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: router("c"), Logger: quiet, TracerProvider: tp, TraceAsChild: true})
	require.NoError(t, err)
	r := rec("x", script{N: 1})
	r.Attributes["AWSTraceHeader"] = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
	r.EventSourceARN = "arn:aws:sqs:us-east-1:000000000000:orders-queue"
	rep := c.Process(context.Background(), batchOf(r))
	require.Equal(t, []string{"sqs-x:applied"}, outcomes(rep))
	s := byMessage(t, exp)["x"][0]
	require.Equal(t, "5759e988bd862e3fe1be46a994272793", s.SpanContext.TraceID().String(), "X-Ray root as the trace id")
	require.Equal(t, "53995c3f42cd8ad8", s.Parent.SpanID().String())
	require.Equal(t, "orders-queue", attrsOf(s)["messaging.destination.name"])
}

func TestProcessorSpans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, exp := spans(t)
	store, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Mode: inbox.Async, Logger: quiet, TracerProvider: tp, TraceAsChild: true})
	require.NoError(t, err)
	ok, okProducer := tracedRec(t, tp, "ok", script{N: 1})
	bad, _ := tracedRec(t, tp, "bad", script{N: 2, Fail: "error"})
	exp.Reset()
	require.Equal(t, []string{"sqs-ok:stored", "sqs-bad:stored"}, outcomes(store.Process(context.Background(), batchOf(ok, bad))))

	var hs handlerSpans
	p, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "c", Router: hs.router("c"), Logger: quiet, TracerProvider: tp, MaxAttempts: 1, TraceAsChild: true})
	require.NoError(t, err)
	st, err := p.Drain(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Applied)
	require.Equal(t, 1, st.Parked)

	got := byMessage(t, exp)
	require.Len(t, got["ok"], 2, "the consumer's store span and the processor's apply span")
	var outcomesSeen []string
	for _, s := range got["ok"] {
		require.Equal(t, okProducer.TraceID(), s.SpanContext.TraceID())
		require.Equal(t, okProducer.SpanID(), s.Parent.SpanID(), "both children of the writer's span")
		a := attrsOf(s)
		outcomesSeen = append(outcomesSeen, a["sluice.inbox.mode"].(string)+":"+a["sluice.inbox.outcome"].(string))
		if a["sluice.inbox.mode"] == "processor" {
			require.Equal(t, s.SpanContext.SpanID(), hs.seen["ok"].SpanID(), "the handler's ctx carries the span")
		}
	}
	require.ElementsMatch(t, []string{"async:stored", "processor:applied"}, outcomesSeen)
	var parked bool
	for _, s := range got["bad"] {
		if attrsOf(s)["sluice.inbox.mode"] == "processor" {
			require.Equal(t, "failed", attrsOf(s)["sluice.inbox.outcome"])
			require.Equal(t, true, attrsOf(s)["sluice.inbox.parked"])
			require.Equal(t, codes.Error, s.Status.Code)
			parked = true
		}
	}
	require.True(t, parked)
}

// fakeRecorder keeps what it was given.
type fakeRecorder struct {
	mu    sync.Mutex
	calls []recorded
}

type recorded struct {
	dims metrics.Dimensions
	ms   []metrics.Measurement
}

func (f *fakeRecorder) Record(_ context.Context, dims metrics.Dimensions, ms ...metrics.Measurement) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, recorded{dims: dims, ms: append([]metrics.Measurement(nil), ms...)})
}

func TestMetricsRecorderBesideEMF(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var rec fakeRecorder
	var emf jsonLines
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: router("billing"), Logger: quiet, MetricsRecorder: &rec, Metrics: &emf})
	require.NoError(t, err)
	c.Process(context.Background(), batchOf(rec1("m1"), rec1("m1")))
	require.Len(t, rec.calls, 1, "one Record per batch")
	require.Equal(t, metrics.Dimensions{"Service": "consumer", "Consumer": "billing"}, rec.calls[0].dims)
	got := map[string]metrics.Measurement{}
	for _, m := range rec.calls[0].ms {
		got[m.Name] = m
	}
	require.Equal(t, 1.0, got[metrics.InboxProcessed.Name].Value)
	require.Equal(t, metrics.Counter, got[metrics.InboxProcessed.Name].Kind)
	require.Equal(t, 1.0, got[metrics.InboxDuplicates.Name].Value)
	require.Equal(t, metrics.Histogram, got[metrics.CommitToApplyLatency.Name].Kind)
	require.Len(t, got[metrics.CommitToApplyLatency.Name].Samples, 1)
	require.Equal(t, 1, emf.n, "the EMF shorthand still writes its line")
}

func rec1(id string) events.SQSMessage { return rec(id, script{N: 1}) }

type jsonLines struct{ n int }

func (j *jsonLines) Write(p []byte) (int, error) {
	var v map[string]any
	if json.Unmarshal(p, &v) == nil {
		j.n++
	}
	return len(p), nil
}

// By default a consumer span follows the OpenTelemetry messaging conventions: named
// "process <queue>", linked to the span that wrote the event (its creation context), its parent
// the span in the handler's context (the invocation's) (issue 21, item 8).
func TestConsumerSpanLinksTheWriterByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, exp := spans(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: router("c"), Logger: quiet, TracerProvider: tp})
	require.NoError(t, err)
	r, producer := tracedRec(t, tp, "x", script{N: 1})
	r.EventSourceARN = "arn:aws:sqs:us-east-1:000000000000:orders-queue"
	exp.Reset()
	ictx, inv := tp.Tracer("lambda").Start(context.Background(), "invocation")
	require.Equal(t, []string{"sqs-x:applied"}, outcomes(c.Process(ictx, batchOf(r))))
	inv.End()
	s := byMessage(t, exp)["x"][0]
	require.Equal(t, "process orders-queue", s.Name)
	require.Equal(t, inv.SpanContext().SpanID(), s.Parent.SpanID(), "the invocation is the parent")
	require.Len(t, s.Links, 1)
	require.Equal(t, producer.SpanID(), s.Links[0].SpanContext.SpanID(), "linked to the writer's span")
}
