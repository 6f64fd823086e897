package inbox

import (
	"context"
	"encoding/hex"
	"strings"
	"time"

	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/wire"
)

// scopeName is the instrumentation scope of the inbox's spans.
const scopeName = "github.com/sluicehq/sluice/pkg/inbox"

// Attributes sluice adds to the inbox's spans beside the messaging semantic conventions
// (docs/tracing.md lists them).
const (
	// spanAttrOutcome is the record's final outcome: applied, duplicate, skipped, stored or
	// failed (see Outcome), set once its transaction committed or rolled back.
	spanAttrOutcome = wire.InboxOutcomeAttr
	// spanAttrCommitToApplyMillis is the commit-to-apply latency of an applied or skipped
	// message: the span's end minus the message's createdAt attribute.
	spanAttrCommitToApplyMillis = "sluice.inbox.commit_to_apply_ms"
	// spanAttrEventType is the message's event type.
	spanAttrEventType = "sluice.event_type"
	// spanAttrMode is the consumer's commit mode (per-record, batched, async) or "processor".
	spanAttrMode = "sluice.inbox.mode"
	// spanAttrParked is set on a processor's failed attempt that parked the row.
	spanAttrParked = "sluice.inbox.parked"
)

// awsTraceHeader is the SQS system attribute that carries an X-Ray trace header
// (Root=1-...;Parent=...;Sampled=1) when the sender or SNS had active tracing.
const awsTraceHeader = "AWSTraceHeader"

// defaultPropagator is the propagator outbox.Write injects with by default: W3C trace context.
var defaultPropagator propagation.TextMapPropagator = propagation.TraceContext{}

// tracing starts and ends the inbox's spans. A nil *tracing is tracing off: every caller
// checks for nil first, so a consumer without a TracerProvider does no tracing work at all.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// static are the attributes every span of this consumer carries.
	static []otelattr.KeyValue
	// child: the span is a child of the writer's span (ConsumerConfig.TraceAsChild), not linked to it.
	child bool
}

func newTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator, consumer, mode string, child bool) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer(scopeName), prop: prop, child: child, static: []otelattr.KeyValue{
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingConsumerGroupName(consumer),
		otelattr.String(spanAttrMode, mode),
	}}
}

// start starts the consumer span of msg, named "process <destination>" (the messaging
// conventions' {operation} {destination}). The message's creation context is the writer's span,
// from its headers (traceparent), or else the X-Ray header xray. By default the span links to it
// (the conventions' recommendation: a record is one message of one trace, but its consumer may
// run in another, the invocation's, which spans up to ten messages of as many traces), and its
// parent is the span in ctx, if any. With child (ConsumerConfig.TraceAsChild) the creation context is
// the parent, which puts the effect in the writer's trace, and the invocation becomes a link.
// An X-Ray context that is not the creation context is linked either way.
func (t *tracing) start(ctx context.Context, msg Message, xray, queueARN string, at time.Time) (context.Context, trace.Span) {
	return t.startFrom(ctx, msg, delivery{system: semconv.MessagingSystemAWSSQS, destination: queueName(queueARN), xray: xray}, at)
}

// startFrom is start for a delivery of any messaging system: d's system, destination (the
// queue, stream or topic name), X-Ray header and own attributes.
func (t *tracing) startFrom(ctx context.Context, msg Message, d delivery, at time.Time) (context.Context, trace.Span) {
	creation := trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(msg.Headers)))
	var links []trace.Link
	if xsc, ok := parseAWSTraceHeader(d.xray); ok {
		if !creation.IsValid() {
			creation = xsc
		} else if xsc.TraceID() != creation.TraceID() || xsc.SpanID() != creation.SpanID() {
			links = append(links, trace.Link{SpanContext: xsc, Attributes: []otelattr.KeyValue{otelattr.String("sluice.link", "aws-xray")}})
		}
	}
	if creation.IsValid() {
		if t.child {
			if inv := trace.SpanContextFromContext(ctx); inv.IsValid() {
				links = append(links, trace.Link{SpanContext: inv, Attributes: []otelattr.KeyValue{otelattr.String("sluice.link", "invocation")}})
			}
			ctx = trace.ContextWithRemoteSpanContext(ctx, creation)
		} else {
			links = append(links, trace.Link{SpanContext: creation, Attributes: []otelattr.KeyValue{otelattr.String("sluice.link", "creation")}})
		}
	}
	name := "process"
	if d.destination != "" {
		name += " " + d.destination
	}
	attrs := make([]otelattr.KeyValue, len(t.static), len(t.static)+6+len(d.attrs))
	copy(attrs, t.static)
	attrs = append(attrs, d.system)
	if d.destination != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(d.destination))
	}
	attrs = append(attrs, d.attrs...)
	if msg.ID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(msg.ID), otelattr.String(spanAttrEventType, msg.EventType),
			semconv.MessagingMessageBodySize(len(msg.Payload)))
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(at),
		trace.WithLinks(links...), trace.WithAttributes(attrs...))
}

// end records the final outcome on span and ends it at now.
func (t *tracing) end(span trace.Span, msg Message, out Outcome, err error, now time.Time, extra ...otelattr.KeyValue) {
	attrs := append(extra, otelattr.String(spanAttrOutcome, out.String()))
	if (out == Applied || out == Skipped) && !msg.CreatedAt.IsZero() {
		attrs = append(attrs, otelattr.Int64(spanAttrCommitToApplyMillis, now.Sub(msg.CreatedAt).Milliseconds()))
	}
	span.SetAttributes(attrs...)
	if out == Failed {
		if err != nil {
			span.RecordError(err, trace.WithTimestamp(now))
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetStatus(codes.Error, "failed")
		}
	}
	span.End(trace.WithTimestamp(now))
}

// recordCtx returns the context r's work runs in: ctx itself with tracing off, otherwise the
// context of r's span, started on first use (the record's turn in the batch).
func (b *batch) recordCtx(ctx context.Context, r *record) context.Context {
	t := b.c.tracing
	if t == nil {
		return ctx
	}
	if r.span == nil {
		r.ctx, r.span = t.startFrom(ctx, r.msg, r.delivery, b.c.now())
	}
	return r.ctx
}

// endSpan ends r's span with its final result, once; a record whose turn never came (the
// batch stopped before it) gets a span of no duration, so every failure shows.
func (b *batch) endSpan(ctx context.Context, r *record) {
	t := b.c.tracing
	if t == nil || r.spanDone {
		return
	}
	b.recordCtx(ctx, r)
	res := b.results[r.i]
	t.end(r.span, r.msg, res.Outcome, res.Err, b.c.now())
	r.spanDone = true
}

// endSpans ends the spans of every record not ended yet.
func (b *batch) endSpans(ctx context.Context) {
	if b.c.tracing == nil {
		return
	}
	for i := range b.recs {
		b.endSpan(ctx, &b.recs[i])
	}
}

// spanEvent adds an event to the span of every record that has one (batched mode: the rollback
// of an optimistic attempt).
func (b *batch) spanEvent(name string) {
	if b.c.tracing == nil {
		return
	}
	for i := range b.recs {
		if r := &b.recs[i]; r.span != nil && !r.spanDone {
			r.span.AddEvent(name)
		}
	}
}

// queueName returns the queue name of an SQS queue ARN (arn:aws:sqs:region:account:name), or "".
func queueName(arn string) string {
	if !strings.HasPrefix(arn, "arn:") {
		return ""
	}
	return arn[strings.LastIndexByte(arn, ':')+1:]
}

// parseAWSTraceHeader reads an X-Ray trace header, Root=1-5759e988-bd862e3fe1be46a994272793;
// Parent=53995c3f42cd8ad8;Sampled=1, as a remote span context: the trace id is the root's
// epoch and unique parts together (X-Ray ids are valid W3C trace ids), the span id the parent.
func parseAWSTraceHeader(h string) (trace.SpanContext, bool) {
	if h == "" {
		return trace.SpanContext{}, false
	}
	var root, parent string
	sampled := false
	for _, part := range strings.Split(h, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Root":
			root = v
		case "Parent":
			parent = v
		case "Sampled":
			sampled = v == "1"
		}
	}
	fields := strings.Split(root, "-")
	if len(fields) != 3 || fields[0] != "1" || len(fields[1]) != 8 || len(fields[2]) != 24 || len(parent) != 16 {
		return trace.SpanContext{}, false
	}
	var tid trace.TraceID
	var sid trace.SpanID
	if _, err := hex.Decode(tid[:], []byte(fields[1]+fields[2])); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(sid[:], []byte(parent)); err != nil {
		return trace.SpanContext{}, false
	}
	var flags trace.TraceFlags
	if sampled {
		flags = trace.FlagsSampled
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags, Remote: true})
	return sc, sc.IsValid()
}
