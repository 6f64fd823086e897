package main

// The tracing suite (issue 14): the relay's and the consumer's throughput without a tracer
// provider (the default), with OpenTelemetry's no-op provider, and with a recording SDK
// provider that samples every span (batch span processor into an exporter that counts and drops
// them, so the cost measured is sluice's instrumentation and the SDK's, not an exporter's I/O).
// Every event carries a traceparent, as outbox.Write writes it inside a span, so the relay
// builds its links and the consumer its parent. The variants run interleaved, best of several
// repeats each, on the same database; the overhead is the recording run's throughput against
// the untraced one's. Target: at most 5%.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// TracingResult is the tracing suite's runs.
type TracingResult struct {
	// Runs holds the best run of each component (relay, per-record, batched) and variant.
	Runs []TracingRun
	// Repeats is how often each variant ran.
	Repeats int
}

// TracingRun is one component under one tracer variant.
type TracingRun struct {
	// Component is "relay" or the consumer's mode.
	Component string
	// Variant is tracingNone, tracingNoop or tracingRecording.
	Variant string
	Events  int
	Elapsed time.Duration
	// Spans the recording provider exported during the best run.
	Spans int64
	// Rates of every repeat (events/s); Elapsed is the best one's.
	Rates []float64
}

// Rate is the throughput in events per second.
func (r TracingRun) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Events) / r.Elapsed.Seconds()
}

const (
	tracingNone      = "no tracer provider (default)"
	tracingNoop      = "OpenTelemetry no-op provider"
	tracingRecording = "recording SDK provider, every span sampled"
)

var tracingVariants = []string{tracingNone, tracingNoop, tracingRecording}

// countingExporter counts and drops exported spans.
type countingExporter struct{ n atomic.Int64 }

func (e *countingExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.n.Add(int64(len(spans)))
	return nil
}
func (e *countingExporter) Shutdown(context.Context) error { return nil }

// tracerFor returns the variant's provider (nil for none), the exporter counting its spans and
// the function that flushes and stops it.
func tracerFor(variant string) (trace.TracerProvider, *countingExporter, func()) {
	switch variant {
	case tracingNoop:
		return noop.NewTracerProvider(), nil, func() {}
	case tracingRecording:
		exp := &countingExporter{}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(exp))
		return tp, exp, func() { _ = tp.Shutdown(context.Background()) }
	}
	return nil, nil, func() {}
}

// benchTraceparent is the writer's span context every benchmark event carries.
var benchSpanContext = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
	SpanID:  trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled,
})

func tracingSizes(sz Sizes) (relayRows, deliveries, repeats int) {
	if sz.Name == "quick" {
		return 3_000, 2_000, 2
	}
	return 20_000, 10_000, 3
}

func runTracingSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	relayRows, deliveries, repeats := tracingSizes(sz)
	res := &TracingResult{Repeats: repeats}
	best := map[[2]string]*TracingRun{}
	keep := func(r TracingRun) {
		k := [2]string{r.Component, r.Variant}
		b := best[k]
		if b == nil {
			b = &TracingRun{Component: r.Component, Variant: r.Variant}
			best[k] = b
		}
		b.Rates = append(b.Rates, r.Rate())
		if b.Elapsed == 0 || r.Elapsed < b.Elapsed {
			b.Events, b.Elapsed, b.Spans = r.Events, r.Elapsed, r.Spans
		}
		log.Info("tracing run", "component", r.Component, "variant", r.Variant, "events", r.Events,
			"elapsed", r.Elapsed.Round(time.Millisecond), "ev/s", int(r.Rate()), "spans", r.Spans)
	}

	pool, _, err := env.NewDatabase(ctx, "tracing", consumerWorkers+4, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	for range repeats {
		for _, v := range tracingVariants {
			r, err := tracedRelayRun(ctx, pool, relayRows, v)
			if err != nil {
				return fmt.Errorf("relay, %s: %w", v, err)
			}
			keep(r)
		}
	}

	if _, err := pool.Exec(ctx, `CREATE TABLE bench_applied (
		message_id text PRIMARY KEY, order_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	router := inbox.NewRouter(inbox.FailUnknown)
	router.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO bench_applied (message_id, order_id) VALUES ($1, $2)", msg.ID, msg.AggregateID)
		return err
	})
	batches, unique := consumerBatches(deliveries, 10)
	tp := fmt.Sprintf("00-%s-%s-01", benchSpanContext.TraceID(), benchSpanContext.SpanID())
	for _, b := range batches {
		for i := range b.Records {
			b.Records[i].MessageAttributes["traceparent"] = events.SQSMessageAttribute{DataType: "String", StringValue: &tp}
		}
	}
	for range repeats {
		for _, mode := range []inbox.Mode{inbox.PerRecord, inbox.Batched} {
			for _, v := range tracingVariants {
				r, err := tracedConsumerRun(ctx, pool, router, mode, batches, unique, v)
				if err != nil {
					return fmt.Errorf("consumer %s, %s: %w", mode, v, err)
				}
				keep(r)
			}
		}
	}
	for _, c := range []string{"relay", inbox.PerRecord.String(), inbox.Batched.String()} {
		for _, v := range tracingVariants {
			if b := best[[2]string{c, v}]; b != nil {
				res.Runs = append(res.Runs, *b)
			}
		}
	}
	rep.Tracing = res
	return nil
}

// tracedRelayRun seeds n rows (each with the writer's traceparent, as outbox.Write leaves it)
// and times one relay with the variant's tracer until every row is published.
func tracedRelayRun(ctx context.Context, pool *pgxpool.Pool, n int, variant string) (TracingRun, error) {
	if _, err := pool.Exec(ctx, "TRUNCATE outbox_event"); err != nil {
		return TracingRun{}, err
	}
	wctx := trace.ContextWithSpanContext(ctx, benchSpanContext)
	for done := 0; done < n; {
		chunk := min(5_000, n-done)
		msgs := make([]outbox.Message, chunk)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", done+i),
				PartitionKey: fmt.Sprintf("k%d", (done+i)%1000), EventType: "OrderCreated", Payload: json.RawMessage(`{"n":1}`)}
		}
		if err := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error { _, err := outbox.Write(wctx, tx, msgs...); return err }); err != nil {
			return TracingRun{}, err
		}
		done += chunk
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_event"); err != nil {
		return TracingRun{}, err
	}
	tp, exp, stop := tracerFor(variant)
	pub := &stubPublisher{}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, TracerProvider: tp,
		Topics: map[string]string{"orders": "arn:aws:sns:us-east-1:000000000000:orders"}})
	if err != nil {
		return TracingRun{}, err
	}
	elapsed, err := drainWith(ctx, pool, []*outbox.Relay{r}, n, nil, 3*time.Minute)
	if err != nil {
		return TracingRun{}, fmt.Errorf("%d of %d published: %w", pub.events.Load(), n, err)
	}
	stop()
	run := TracingRun{Component: "relay", Variant: variant, Events: n, Elapsed: elapsed}
	if exp != nil {
		run.Spans = exp.n.Load()
	}
	return run, nil
}

// tracedConsumerRun applies the batches with a consumer of the mode and the variant's tracer.
func tracedConsumerRun(ctx context.Context, pool *pgxpool.Pool, router *inbox.Router, mode inbox.Mode, batches []events.SQSEvent, unique int, variant string) (TracingRun, error) {
	if _, err := pool.Exec(ctx, "TRUNCATE inbox_event, bench_applied"); err != nil {
		return TracingRun{}, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE inbox_event"); err != nil {
		return TracingRun{}, err
	}
	tp, exp, stop := tracerFor(variant)
	c, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{Consumer: "bench", Router: router, Mode: mode, TracerProvider: tp})
	if err != nil {
		return TracingRun{}, err
	}
	res, err := runConsumer(ctx, c, batches)
	stop()
	if err != nil {
		return TracingRun{}, err
	}
	var applied int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM bench_applied").Scan(&applied); err != nil {
		return TracingRun{}, err
	}
	if applied != unique {
		return TracingRun{}, fmt.Errorf("%d effects applied for %d unique messages", applied, unique)
	}
	run := TracingRun{Component: mode.String(), Variant: variant, Events: res.Deliveries, Elapsed: res.Elapsed}
	if exp != nil {
		run.Spans = exp.n.Load()
	}
	return run, nil
}

// tracingMarkdown renders the suite's section.
// tracingTarget is issue 14's bound on the recording provider's cost in throughput.
const tracingTarget = 0.05

// issue14Targets judges each component's recording run against its untraced one.
func (r *Report) issue14Targets() []target {
	t := r.Tracing
	if t == nil {
		return nil
	}
	runs := map[string]map[string]TracingRun{}
	var order []string
	for _, run := range t.Runs {
		if runs[run.Component] == nil {
			runs[run.Component] = map[string]TracingRun{}
			order = append(order, run.Component)
		}
		runs[run.Component][run.Variant] = run
	}
	var ts []target
	for _, c := range order {
		none, okn := runs[c][tracingNone]
		rec, okr := runs[c][tracingRecording]
		if !okn || !okr || none.Rate() <= 0 {
			continue
		}
		loss := 1 - rec.Rate()/none.Rate()
		measured := fmt.Sprintf("%+.1f%% (%.0f vs %.0f events/s, best of %d each)", -loss*100, rec.Rate(), none.Rate(), t.Repeats)
		if noop, ok := runs[c][tracingNoop]; ok {
			measured += fmt.Sprintf("; no-op provider %+.1f%%", (noop.Rate()/none.Rate()-1)*100)
		}
		ts = append(ts, target{14, "Tracing overhead, " + c, fmt.Sprintf("recording provider, every span sampled: ≤ %.0f%% less throughput than none", tracingTarget*100),
			measured, verdict(loss <= tracingTarget)})
	}
	return ts
}

func (r *Report) tracingMarkdown(w func(string, ...any)) {
	t := r.Tracing
	if t == nil {
		return
	}
	w("## 10. Tracing overhead (issue 14)\n\n")
	w("Throughput of the relay (1 instance, publisher stub of 0 ms) and of the consumer (batches of 10, 10%% duplicates, %d workers) "+
		"without a tracer provider, with OpenTelemetry's no-op provider, and with a recording SDK provider sampling every span "+
		"(batch span processor, an exporter that counts and drops). Every event carries a traceparent. Best of %d interleaved runs each; "+
		"target: at most 5%% less throughput with the recording provider.\n\n", consumerWorkers, t.Repeats)
	w("| component | tracer | events | events/s | vs. no provider | spans exported | every run (events/s) |\n|---|---|---|---|---|---|---|\n")
	base := map[string]float64{}
	for _, run := range t.Runs {
		if run.Variant == tracingNone {
			base[run.Component] = run.Rate()
		}
	}
	for _, run := range t.Runs {
		vs := "—"
		if b := base[run.Component]; b > 0 && run.Variant != tracingNone {
			vs = fmt.Sprintf("%+.1f%%", (run.Rate()/b-1)*100)
		}
		rates := ""
		for i, x := range run.Rates {
			if i > 0 {
				rates += ", "
			}
			rates += fmt.Sprintf("%.0f", x)
		}
		w("| %s | %s | %d | %.0f | %s | %d | %s |\n", run.Component, run.Variant, run.Events, run.Rate(), vs, run.Spans, rates)
	}
	w("\n")
}
