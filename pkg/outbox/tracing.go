package outbox

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/metrics"
)

// scopeName is the instrumentation scope of the relay's spans.
const scopeName = "github.com/sluicehq/sluice/pkg/outbox"

// maxLinksPerSpan is the most links a publish span carries: the OpenTelemetry SDK's default
// SpanLimits.LinkCountLimit. A call with more events adds a child span per further 128.
const maxLinksPerSpan = 128

// relayDimensions are the dimensions of every relay metric.
var relayDimensions = metrics.Dimensions{metrics.DimensionService: metrics.ServiceRelay}

// recorder combines the EMF shorthand w and rec; nil when both are unset (no metrics, no work).
func recorder(w io.Writer, rec metrics.Recorder) metrics.Recorder {
	if w == nil {
		return metrics.Tee(rec)
	}
	return metrics.Tee(metrics.NewEMF(w), rec)
}

// defaultPropagator is what Write injects and the relay and the inbox extract when their
// configuration names none: W3C trace context (traceparent, tracestate).
var defaultPropagator propagation.TextMapPropagator = propagation.TraceContext{}

// tracePublisher returns p itself when tp is nil (tracing off costs nothing), otherwise p
// behind a publisher that records a span per PublishBatch call.
func tracePublisher(p Publisher, tp trace.TracerProvider, prop propagation.TextMapPropagator) Publisher {
	if tp == nil || p == nil {
		return p
	}
	if prop == nil {
		prop = defaultPropagator
	}
	return &tracingPublisher{next: p, tracer: tp.Tracer(scopeName), prop: prop}
}

// tracingPublisher records a span per PublishBatch call, following the messaging semantic
// conventions for a batch send: a span of kind producer named "publish <topic>", in the
// relay's own trace (a child of the span in ctx, if any), with one link per event to the span
// that wrote it (read from its headers). A publish call carries events of up to ten different
// traces, so it cannot be a child of each; the links let a backend show it inside every one of
// them. Each link holds the event id and the time the row waited in the outbox.
type tracingPublisher struct {
	next   Publisher
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// Limits passes on the wrapped publisher's limits.
func (p *tracingPublisher) Limits(dest string) Limits { return limitsOf(p.next, dest) }

// MessageSize passes on the wrapped publisher's measure.
func (p *tracingPublisher) MessageSize(dest string, e *Event, payloadLen int) int {
	return measure(p.next, dest, e, payloadLen)
}

func (p *tracingPublisher) PublishBatch(ctx context.Context, destination string, events []*Event) []error {
	now := time.Now()
	links := make([]trace.Link, len(events))
	ids := make([]string, len(events))
	var maxWait time.Duration
	for i, e := range events {
		ids[i] = e.EventID.String()
		wait := max(now.Sub(e.CreatedAt), 0)
		maxWait = max(maxWait, wait)
		links[i] = trace.Link{
			SpanContext: trace.SpanContextFromContext(p.prop.Extract(context.Background(), propagation.MapCarrier(e.Headers))),
			Attributes: []attribute.KeyValue{
				semconv.MessagingMessageID(ids[i]),
				attribute.Int64(wire.SpanOutboxWaitMillis, wait.Milliseconds()),
			},
		}
	}
	name, system := destinationName(destination)
	attrs := []attribute.KeyValue{
		system,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("publish"),
		semconv.MessagingDestinationName(name),
		semconv.MessagingBatchMessageCount(len(events)),
		attribute.StringSlice(wire.SpanMessageIDs, ids),
		attribute.Int64(wire.SpanOutboxMaxWaitMillis, maxWait.Milliseconds()),
	}
	if system == semconv.MessagingSystemAWSSNS {
		attrs = append(attrs, semconv.AWSSNSTopicARN(destination))
	}
	first := links[:min(len(links), maxLinksPerSpan)]
	ctx, span := p.tracer.Start(ctx, "publish "+name,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithTimestamp(now),
		trace.WithLinks(first...),
		trace.WithAttributes(attrs...))
	defer span.End()
	// A Kinesis or Kafka call carries up to 500 events, and the SDK keeps 128 links a span by
	// default (SpanLimits.LinkCountLimit, the provider's setting, not ours): the links beyond
	// go on child spans of the call, 128 each, so none is dropped.
	for i := maxLinksPerSpan; i < len(links); i += maxLinksPerSpan {
		part := links[i:min(len(links), i+maxLinksPerSpan)]
		_, more := p.tracer.Start(ctx, "publish "+name,
			trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithTimestamp(now),
			trace.WithLinks(part...),
			trace.WithAttributes(system, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
				semconv.MessagingDestinationName(name), semconv.MessagingBatchMessageCount(len(part)),
				attribute.StringSlice(wire.SpanMessageIDs, ids[i:i+len(part)])))
		defer more.End()
	}
	errs := p.next.PublishBatch(ctx, destination, events)
	failed := 0
	for i, err := range errs {
		if err == nil || i >= len(events) {
			continue
		}
		failed++
		span.AddEvent("publish failed", trace.WithAttributes(
			semconv.MessagingMessageID(ids[i]),
			attribute.String("exception.message", err.Error()),
			attribute.Bool("sluice.permanent", IsPermanent(err)),
		))
	}
	span.SetAttributes(attribute.Int(wire.SpanPublishFailed, failed))
	if failed > 0 {
		span.SetAttributes(semconv.ErrorTypeOther)
		span.SetStatus(codes.Error, fmt.Sprintf("%d of %d entries failed", failed, len(events)))
	}
	return errs
}

// destinationName returns the name of a destination and its messaging.system: for an ARN
// (arn:aws:SERVICE:region:account:NAME, or .../NAME) the last part and "aws.sns" for SNS,
// "aws_sqs" for SQS, "aws.SERVICE" otherwise; for kafka://TOPIC the topic and "kafka"; anything
// else as it is, with the system "unknown".
func destinationName(destination string) (string, attribute.KeyValue) {
	if topic, ok := strings.CutPrefix(destination, "kafka://"); ok {
		return topic, semconv.MessagingSystemKafka
	}
	parts := strings.SplitN(destination, ":", 6)
	if len(parts) < 6 || parts[0] != "arn" {
		return destination, semconv.MessagingSystemKey.String("unknown")
	}
	name := parts[5]
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	switch parts[2] {
	case "sns":
		return name, semconv.MessagingSystemAWSSNS
	case "sqs":
		return name, semconv.MessagingSystemAWSSQS
	case "kinesis":
		return name, semconv.MessagingSystemKey.String(wire.MessagingSystemKinesis)
	case "events":
		return name, semconv.MessagingSystemKey.String(wire.MessagingSystemEventBridge)
	}
	return name, semconv.MessagingSystemKey.String("aws." + parts[2])
}

// traceHeaders returns the headers the writer's propagator injects for the span context of
// ctx, or nil. With the default propagator and no span in ctx it returns at once, allocating
// nothing.
func (w *Writer) traceHeaders(ctx context.Context) map[string]string {
	if _, ok := w.cfg.Propagator.(propagation.TraceContext); ok && !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	w.cfg.Propagator.Inject(ctx, c)
	if len(c) == 0 {
		return nil
	}
	return c
}

// withTrace returns m's headers with the injected trace headers added, in the order the
// relay publishes them (traceparent, tracestate, then by name), while each fits: the attribute
// count, the message size (measured by writeSize, at most maxBytes, and its overhead at most
// maxMessageOverheadBytes) and the attribute name and value rules. It returns m.Headers unchanged when m already carries one of
// the propagator's fields (the caller's trace context wins, and half of two contexts would be
// neither) or when nothing fits. It never modifies the caller's map.
func withTrace(m Message, injected map[string]string, fields []string, maxBytes int) map[string]string {
	for _, f := range fields {
		for k := range m.Headers {
			if strings.EqualFold(k, f) {
				return m.Headers
			}
		}
	}
	room := maxWriteAttributes - contractAttributes(m) - len(m.Headers)
	var h map[string]string
	for _, k := range headerOrder(injected) {
		v := injected[k]
		if room == 0 {
			break
		}
		if _, taken := m.Headers[k]; taken || checkHeaderName(k) != "" || checkAttrValue(v) != "" {
			continue
		}
		next := make(map[string]string, len(m.Headers)+len(injected))
		for hk, hv := range m.Headers {
			next[hk] = hv
		}
		for hk, hv := range h {
			next[hk] = hv
		}
		next[k] = v
		t := m
		t.Headers = next
		if !surelyFits(t, maxBytes) {
			if size, overhead := writeSize(t); size > maxBytes || overhead > maxMessageOverheadBytes {
				break
			}
		}
		h = next
		room--
	}
	if h == nil {
		return m.Headers
	}
	return h
}
