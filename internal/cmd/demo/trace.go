package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/lambdatrace"
)

// The demo's tracing: the orders service (this process) and both Lambdas export their spans as
// JSON lines (stdouttrace, the Lambdas through OTEL_TRACES_EXPORTER=console); this process's
// go straight into a spanLog, the functions' through their log, which the spanLog reads on the
// way to the log file. At the end the demo picks one order and draws its trace.

// functionTraceEnv turns on the Lambdas' console span exporter.
var functionTraceEnv = []string{lambdatrace.EnvTracesExporter + "=" + lambdatrace.ExporterConsole}

// jsonSpan is the part of a stdouttrace span line the waterfall needs.
type jsonSpan struct {
	Name        string
	SpanContext jsonSpanContext
	Parent      jsonSpanContext
	SpanKind    int
	StartTime   time.Time
	EndTime     time.Time
	Attributes  []jsonKV
	Links       []struct {
		SpanContext jsonSpanContext
		Attributes  []jsonKV
	}
	Status struct{ Code string }
}

type jsonSpanContext struct{ TraceID, SpanID string }

type jsonKV struct {
	Key   string
	Value struct{ Value any }
}

func attr(kvs []jsonKV, key string) any {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value.Value
		}
	}
	return nil
}

func (s *jsonSpan) attr(key string) string {
	v := attr(s.Attributes, key)
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

// spanLog is an io.Writer in front of the demo's log: it keeps every span line written through
// it and passes everything on. Writers hand it whole lines (localrun's instances do).
type spanLog struct {
	mu    sync.Mutex
	w     io.Writer
	spans []jsonSpan
}

func (l *spanLog) Write(p []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(p))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	var got []jsonSpan
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte(`{"Name":`)) || !bytes.Contains(line, []byte(`"SpanContext"`)) {
			continue
		}
		var s jsonSpan
		if json.Unmarshal(line, &s) == nil {
			got = append(got, s)
		}
	}
	l.mu.Lock()
	l.spans = append(l.spans, got...)
	l.mu.Unlock()
	return l.w.Write(p)
}

func (l *spanLog) all() []jsonSpan {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]jsonSpan(nil), l.spans...)
}

// newTracerProvider is the orders service's tracer provider: every span, synchronously, to log.
func newTracerProvider(log io.Writer) (*sdktrace.TracerProvider, error) {
	exp, err := stdouttrace.New(stdouttrace.WithWriter(log))
	if err != nil {
		return nil, err
	}
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("orders-service")))), nil
}

// statementSpans is a pgx tracer that records a client span per statement run inside a traced
// context (the orders service's transactions), named by what it does: BEGIN, INSERT demo_orders,
// INSERT outbox_event (outbox.Write), COMMIT.
type statementSpans struct{ tracer trace.Tracer }

var _ pgx.QueryTracer = statementSpans{}

type stmtSpanKey struct{}

func (t statementSpans) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	ctx, span := t.tracer.Start(ctx, statementName(data.SQL), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.DBSystemNamePostgreSQL))
	return context.WithValue(ctx, stmtSpanKey{}, span)
}

func (t statementSpans) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if span, ok := ctx.Value(stmtSpanKey{}).(trace.Span); ok {
		if data.Err != nil {
			span.RecordError(data.Err)
		}
		span.End()
	}
}

func statementName(sql string) string {
	f := strings.Fields(sql)
	if len(f) == 0 {
		return "SQL"
	}
	verb := strings.ToUpper(f[0])
	if verb == "INSERT" && len(f) > 2 && strings.EqualFold(f[1], "INTO") {
		return "INSERT " + f[2]
	}
	return verb
}

// orderTrace is one order's path through the pipeline, from the spans.
type orderTrace struct {
	orderID    string
	place      jsonSpan   // the orders service's PlaceOrder span (the writer's span)
	statements []jsonSpan // its statements
	publish    *jsonSpan  // the relay's publish call that carried the event
	batch      int        // events in that call
	process    *jsonSpan  // the ledger's applied consumer span
	deliveries int        // consumer spans of the event (more than 1: redelivered or duplicate)
}

func (o *orderTrace) total() time.Duration { return o.process.EndTime.Sub(o.place.StartTime) }

// consumedOrder is the order whose PlaceOrder span the consumer span s is a child of or links to.
func consumedOrder(byID map[string]*orderTrace, s *jsonSpan) *orderTrace {
	if o := byID[s.Parent.SpanID]; o != nil && s.SpanContext.TraceID == o.place.SpanContext.TraceID {
		return o
	}
	for _, l := range s.Links {
		if o := byID[l.SpanContext.SpanID]; o != nil {
			return o
		}
	}
	return nil
}

// traces assembles every order whose trace is complete: written, published, applied.
func traces(spans []jsonSpan) []*orderTrace {
	byID := map[string]*orderTrace{}
	for _, s := range spans {
		if s.Name == placeOrderSpan {
			byID[s.SpanContext.SpanID] = &orderTrace{orderID: s.attr(attrOrderID), place: s}
		}
	}
	for i := range spans {
		s := &spans[i]
		if s.attr(wire.InboxOutcomeAttr) != "" {
			// A consumer span links to the writer's span (the messaging conventions; pkg/inbox's
			// default), or is its child with TraceAsChild.
			if o := consumedOrder(byID, s); o != nil {
				o.deliveries++
				if s.attr(wire.InboxOutcomeAttr) == "applied" {
					o.process = s
				}
			}
			continue
		}
		if o := byID[s.Parent.SpanID]; o != nil && s.SpanContext.TraceID == o.place.SpanContext.TraceID {
			o.statements = append(o.statements, *s)
		}
		for _, l := range s.Links {
			if o := byID[l.SpanContext.SpanID]; o != nil && strings.HasPrefix(s.Name, "publish ") && s.attr(wire.SpanPublishFailed) == "0" {
				if o.publish == nil || s.StartTime.After(o.publish.StartTime) {
					o.publish, o.batch = s, len(s.Links)
				}
			}
		}
	}
	var out []*orderTrace
	for _, o := range byID {
		if o.publish != nil && o.process != nil {
			sort.Slice(o.statements, func(i, j int) bool { return o.statements[i].StartTime.Before(o.statements[j].StartTime) })
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].total() < out[j].total() })
	return out
}

// printWaterfall draws the median complete trace, or says why there is none; hop names the
// way from the broker to the consumer.
func printWaterfall(w io.Writer, spans []jsonSpan, produced int, hop string) {
	all := traces(spans)
	if len(all) == 0 {
		fmt.Fprintf(w, "\nno complete trace among %d spans (see the function logs)\n", len(spans))
		return
	}
	o := all[len(all)/2]
	fmt.Fprintf(w, "\none order's trace: %s, the median of %d complete traces (of %d orders); trace %s\n",
		o.orderID, len(all), produced, o.place.SpanContext.TraceID)
	t0, total := o.place.StartTime, o.total()
	const width = 40
	row := func(label string, start, end time.Time, fill string) {
		off := int(float64(start.Sub(t0)) / float64(total) * width)
		n := max(1, int(float64(end.Sub(start))/float64(total)*width+0.5))
		off = min(off, width-1)
		n = min(n, width-off)
		fmt.Fprintf(w, "  %-46s %9s %9s  |%s%s%s|\n", label, ms(start.Sub(t0)), ms(end.Sub(start)),
			strings.Repeat(" ", off), strings.Repeat(fill, n), strings.Repeat(" ", width-off-n))
	}
	fmt.Fprintf(w, "  %-46s %9s %9s\n", "step", "at", "took")
	row("write: PlaceOrder (orders service)", o.place.StartTime, o.place.EndTime, "█")
	commitEnd := o.place.EndTime
	for _, s := range o.statements {
		label := "  " + s.Name
		switch {
		case s.Name == "INSERT outbox_event":
			label += " (outbox.Write)"
		case s.Name == "COMMIT":
			label = "  commit"
			commitEnd = s.EndTime
		}
		row(label, s.StartTime, s.EndTime, "█")
	}
	p, c := o.publish, o.process
	row("outbox: waits for the relay (poll, claim)", commitEnd, p.StartTime, "░")
	row(fmt.Sprintf("publish: %s (relay, %d events)", shorten(strings.TrimPrefix(p.Name, "publish "), 18), o.batch), p.StartTime, p.EndTime, "█")
	row(hop, p.EndTime, c.StartTime, "░")
	row(fmt.Sprintf("apply: %s (ledger, %s)", shorten(c.Name, 22), c.attr(wire.InboxOutcomeAttr)), c.StartTime, c.EndTime, "█")
	relation := "links to PlaceOrder"
	if c.SpanContext.TraceID == o.place.SpanContext.TraceID {
		relation = "is a child of PlaceOrder"
	}
	fmt.Fprintf(w, "  commit to apply %s; the consumer span %s, the publish span links to it", ms(c.EndTime.Sub(commitEnd)), relation)
	if o.deliveries > 1 {
		fmt.Fprintf(w, "; %d deliveries", o.deliveries)
	}
	fmt.Fprintln(w)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// The orders service's span around each order.
const (
	placeOrderSpan = "PlaceOrder"
	attrOrderID    = "order.id"
)

func placeOrderAttrs(id string) trace.SpanStartOption {
	return trace.WithAttributes(attribute.String(attrOrderID, id))
}
