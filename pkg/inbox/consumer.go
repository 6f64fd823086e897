package inbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/pkg/metrics"
)

// Beginner starts transactions: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx (whose Begin opens a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Mode is how a Consumer turns a batch into transactions.
type Mode int

const (
	// PerRecord applies each record in its own transaction. The default.
	PerRecord Mode = iota
	// Batched applies the whole batch in one transaction: one statement inserts the batch's
	// inbox rows, the handlers of the new messages run in that transaction, and it commits once.
	// A handler failure makes the consumer roll back and apply the batch again with a SAVEPOINT
	// per record, so the failing record rolls back alone (see runBatched).
	Batched
	// Async only stores each message (payload and attributes) in inbox_event and acknowledges;
	// a Processor applies it later.
	Async
)

// String returns the mode's name as accepted by ParseMode.
func (m Mode) String() string {
	switch m {
	case PerRecord:
		return "per-record"
	case Batched:
		return "batched"
	case Async:
		return "async"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode parses "per-record" (or ""), "batched" or "async", e.g. the value of the
// SLUICE_CONSUMER_COMMIT_MODE environment variable.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "per-record":
		return PerRecord, nil
	case "batched":
		return Batched, nil
	case "async":
		return Async, nil
	}
	return 0, fmt.Errorf("%w: unknown commit mode %q (want per-record, batched or async)", ErrInvalidConfig, s)
}

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Consumer names this consumer: the first half of the inbox key. Two consumers with
	// different names on one database each apply every message once. Required.
	Consumer string
	// Router maps event types to handlers. Required except in the Async mode, where the
	// Processor uses it instead.
	Router *Router
	// Mode chooses per-record, batched or asynchronous processing. Defaults to PerRecord.
	Mode Mode
	// DeadlineMargin: a record is not started when the context's deadline (the Lambda's) is
	// nearer than this; it is reported failed and comes back. Defaults to 3 seconds; a negative
	// value disables the check (the context's cancellation still stops the batch).
	DeadlineMargin time.Duration
	// StorePayload keeps the payload and headers in inbox_event in the synchronous modes, for
	// audit or replay. Defaults to false. The Async mode always stores them.
	StorePayload bool
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics receives Embedded Metric Format lines (os.Stdout in a Lambda): a shorthand for
	// MetricsRecorder: metrics.NewEMF(Metrics). Defaults to nil, which writes none.
	Metrics io.Writer
	// MetricsRecorder receives the consumer's metrics (the inbox metrics of pkg/metrics, with
	// dimensions {Service: consumer, Consumer: <name>}) once per batch, e.g.
	// otelmetrics.New(provider).
	// When Metrics is set too, both receive everything. Defaults to none.
	MetricsRecorder metrics.Recorder
	// TracerProvider records a consumer span per record, named "process <queue, stream or
	// topic>" and linked to the span that wrote the event, its creation context (see
	// docs/tracing.md); handlers get its context. Defaults to none: no spans, no cost; pass
	// otel.GetTracerProvider() for the global one.
	TracerProvider trace.TracerProvider
	// TraceAsChild makes each record's span a child of the span that wrote the event instead
	// of a span linked to it, so that the effect shows inside the writer's trace. Defaults to
	// false: linked, as the OpenTelemetry messaging conventions recommend for a consumer, the
	// span's parent being the span in the handler's context (the Lambda invocation's, when
	// the function is instrumented), if any.
	TraceAsChild bool
	// Propagator reads the writer's span context from the message's headers. Defaults to W3C
	// trace context (propagation.TraceContext), what outbox.Write injects.
	Propagator propagation.TextMapPropagator
	// SQSMaxReceiveCount is the SQS queue's maxReceiveCount (its redrive policy): a record that
	// fails on that receive (its ApproximateReceiveCount) goes to the DLQ next, so its dead
	// letter is marked dead then (Result.Dead, the InboxDeadLetters metric). Defaults to 5, the
	// CDK construct's default, which sets it from the queue it builds
	// (SLUICE_CONSUMER_MAX_RECEIVE_COUNT).
	SQSMaxReceiveCount int
	// StreamMaxAttempts is how many times a Kinesis or Kafka event source mapping delivers a
	// failing record before it gives up (its MaximumRetryAttempts + 1): the record's dead letter
	// is marked dead when that many of its failures are recorded (SQS gives a receive count:
	// SQSMaxReceiveCount). Defaults to 11 (the CDK
	// construct's default RetryAttempts, 10, plus 1; it sets it from the mapping it builds,
	// SLUICE_CONSUMER_STREAM_MAX_ATTEMPTS). ConsumeKafka does not use it: its give-up
	// (KafkaOptions.MaxAttempts with a DeadLetterTopic) marks the dead letter.
	StreamMaxAttempts int
	// Tenants, when set, makes this a fleet consumer: each message is applied in the database
	// of its tenant (the TenantHeader a fleet relay carries), opened by Tenants, and
	// NewConsumer's db must be nil. A message without a tenant, or of a tenant Tenants does
	// not know, fails with ErrUnknownTenant. See docs/inbox.md, "Fleet: one consumer, many
	// tenant databases". Defaults to nil: every message is applied in db.
	Tenants *TenantPools
	// ClaimCheck fetches payloads a claim check stored in S3 (sluice's relay with
	// outbox.ClaimCheck, or an AWS extended client) before the handler runs; see
	// docs/claimcheck.md. Defaults to nil: a message whose payload is in S3 fails with
	// ErrClaimCheck (and reaches the DLQ), never reaches a handler as a pointer.
	ClaimCheck *ClaimCheck
}

// Defaults of ConsumerConfig.
const (
	// DefaultDeadlineMargin is ConsumerConfig.DeadlineMargin's default.
	DefaultDeadlineMargin = 3 * time.Second
	// DefaultSQSMaxReceiveCount is ConsumerConfig.SQSMaxReceiveCount's default.
	DefaultSQSMaxReceiveCount = 5
	// DefaultStreamMaxAttempts is ConsumerConfig.StreamMaxAttempts's default.
	DefaultStreamMaxAttempts = 11
)

// WithDefaults returns a copy of c with every zero field set to its documented default.
func (c ConsumerConfig) WithDefaults() ConsumerConfig {
	if c.DeadlineMargin == 0 {
		c.DeadlineMargin = DefaultDeadlineMargin
	}
	if c.SQSMaxReceiveCount == 0 {
		c.SQSMaxReceiveCount = DefaultSQSMaxReceiveCount
	}
	if c.StreamMaxAttempts == 0 {
		c.StreamMaxAttempts = DefaultStreamMaxAttempts
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Propagator == nil {
		c.Propagator = defaultPropagator
	}
	return c
}

func (c ConsumerConfig) validate() error {
	if err := validateConsumer(c.Consumer); err != nil {
		return err
	}
	if c.SQSMaxReceiveCount < 1 || c.StreamMaxAttempts < 1 {
		return fmt.Errorf("%w: SQSMaxReceiveCount and StreamMaxAttempts must be at least 1, got %d and %d",
			ErrInvalidConfig, c.SQSMaxReceiveCount, c.StreamMaxAttempts)
	}
	switch c.Mode {
	case PerRecord, Batched:
		if c.Router == nil {
			return fmt.Errorf("%w: Router is required in the %s mode", ErrInvalidConfig, c.Mode)
		}
	case Async:
	default:
		return fmt.Errorf("%w: unknown Mode %d", ErrInvalidConfig, int(c.Mode))
	}
	if c.ClaimCheck != nil {
		return c.ClaimCheck.validate()
	}
	return nil
}

func validateConsumer(name string) error {
	if strings.TrimSpace(name) == "" {
		return fmt.Errorf("%w: Consumer name is required", ErrInvalidConfig)
	}
	if len(name) > 200 || !storableText(name) {
		return fmt.Errorf("%w: Consumer name must be UTF-8 text of at most 200 bytes", ErrInvalidConfig)
	}
	return nil
}

// Consumer applies batches of messages through the inbox: from SQS (HandleSQS), Kinesis
// (HandleKinesis), Kafka through Lambda (HandleKafka) or a franz-go client (ConsumeKafka), or
// whichever of the Lambda event sources invokes it (HandleEvent). Build it once per process
// (Lambda cold start) with NewConsumer; it is safe for concurrent use.
type Consumer struct {
	db      Beginner
	cfg     ConsumerConfig
	log     *slog.Logger
	metrics metrics.Recorder
	dims    metrics.Dimensions
	tracing *tracing // nil: tracing off
	// claimCheck is ConsumerConfig.ClaimCheck with its defaults; nil without one.
	claimCheck *ClaimCheck
	now        func() time.Time
	// layout is how inbox_event is stored (layoutPlain, layoutPartitioned), read once from
	// the catalog (see partition_insert.go); in fleet mode, the tenant database's (tenantPool).
	layout *atomic.Int32
	// tenants opens each tenant's database in fleet mode (ConsumerConfig.Tenants); nil when
	// every message is applied in db, and in a tenant's view of the Consumer (forTenant).
	tenants *TenantPools
}

// NewConsumer returns a Consumer that opens its transactions on db (usually a *pgxpool.Pool),
// or, in fleet mode (cfg.Tenants set, db nil), on each message's tenant database.
func NewConsumer(db Beginner, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case db == nil && cfg.Tenants == nil:
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	case db != nil && cfg.Tenants != nil:
		return nil, fmt.Errorf("%w: db must be nil when Tenants is set (each message is applied in its tenant's database)", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Consumer{
		db:      db,
		cfg:     cfg,
		log:     cfg.Logger.With("consumer", cfg.Consumer),
		metrics: recorder(cfg.Metrics, cfg.MetricsRecorder),
		dims:    dimensions(metrics.ServiceConsumer, cfg.Consumer),
		tracing: newTracing(cfg.TracerProvider, cfg.Propagator, cfg.Consumer, cfg.Mode.String(), cfg.TraceAsChild),
		now:     time.Now,
		layout:  new(atomic.Int32),
		tenants: cfg.Tenants,
	}
	if cfg.ClaimCheck != nil {
		c.claimCheck = cfg.ClaimCheck.withDefaults()
	}
	return c, nil
}

// Outcome is what happened to one record.
type Outcome int

const (
	// Failed: the record was rolled back (or never started) and is reported in BatchItemFailures.
	Failed Outcome = iota
	// Applied: the handler ran and its transaction committed.
	Applied
	// Duplicate: the inbox already held the message; nothing ran. A success.
	Duplicate
	// Skipped: no handler and the router's policy is SkipUnknown; the inbox row committed. A success.
	Skipped
	// Stored: the Async mode stored the message for the Processor. A success.
	Stored
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Failed:
		return "failed"
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Skipped:
		return "skipped"
	case Stored:
		return "stored"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is the outcome of one record.
type Result struct {
	// ItemID identifies the record to its event source (Message.ItemID): the SQS message id,
	// the Kinesis sequence number, or TOPIC-PARTITION@OFFSET for Kafka.
	ItemID string
	// SQSMessageID identifies an SQS record in BatchItemFailures (the same as ItemID); empty
	// for other sources.
	SQSMessageID string
	// MessageID is the dedup key; empty when the record could not be parsed.
	MessageID string
	// EventType is the message's event type; empty when the record could not be parsed.
	EventType string
	// Tenant is the message's tenant (Message.Tenant); empty when it has none or the record
	// could not be parsed.
	Tenant string
	// Outcome is final: successes are reported only after their transaction committed.
	Outcome Outcome
	// Err explains a Failed outcome; it wraps one of the package's sentinels or a database error.
	Err error
	// Dead: the record failed its source's last attempt (see ConsumerConfig.SQSMaxReceiveCount and
	// StreamMaxAttempts) and its dead letter, with the error and payload, is in
	// inbox_dead_letter (ListDeadLetters). Every failure of a record through its own fault is
	// recorded there; only the last one sets Dead.
	Dead bool
}

// Report holds one Result per record, in the batch's order.
type Report struct {
	Results []Result
}

// Count returns how many records had outcome o.
func (r Report) Count(o Outcome) int {
	n := 0
	for _, res := range r.Results {
		if res.Outcome == o {
			n++
		}
	}
	return n
}

// countDead returns how many records failed their last attempt (Result.Dead).
func (r Report) countDead() int {
	n := 0
	for _, res := range r.Results {
		if res.Dead {
			n++
		}
	}
	return n
}

// Response returns the Lambda partial batch response: every failed record's SQS message id.
func (r Report) Response() events.SQSEventResponse {
	resp := events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{}}
	for _, res := range r.Results {
		if res.Outcome == Failed {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: res.SQSMessageID})
		}
	}
	return resp
}

// HandleSQS is the Lambda handler for an SQS event source with ReportBatchItemFailures:
//
//	lambda.StartWithOptions(consumer.HandleSQS, lambda.WithEnableSIGTERM(pool.Close))
//
// It never returns an error: failures are per record, in BatchItemFailures. (A record with an
// empty SQS message id yields an empty identifier, which makes Lambda retry the whole batch;
// nothing is lost.)
func (c *Consumer) HandleSQS(ctx context.Context, event events.SQSEvent) (events.SQSEventResponse, error) {
	return c.Process(ctx, event).Response(), nil
}

// Process applies an SQS batch and reports each record's outcome. An empty batch is a no-op.
func (c *Consumer) Process(ctx context.Context, event events.SQSEvent) Report {
	ds := make([]delivery, len(event.Records))
	for i, m := range event.Records {
		ds[i] = sqsDelivery(m)
	}
	return c.run(ctx, ds)
}

// sqsDelivery turns an SQS record into a delivery: its message id identifies it, its FIFO
// message group orders it (also when it could not be parsed: the group comes from SQS, not
// from the message).
func sqsDelivery(m events.SQSMessage) delivery {
	d := delivery{source: sourceSQS, id: m.MessageId, orderingGroup: m.Attributes["MessageGroupId"],
		system: semconv.MessagingSystemAWSSQS, destination: queueName(m.EventSourceARN), xray: m.Attributes[awsTraceHeader],
		sourceName: m.EventSourceARN, position: m.MessageId}
	d.receiveCount, _ = strconv.Atoi(m.Attributes["ApproximateReceiveCount"])
	msg, err := Parse(m)
	if err != nil {
		d.err = fmt.Errorf("parse record %s: %w", m.MessageId, err)
		d.raw = []byte(m.Body)
		return d
	}
	d.msg = msg
	return d
}

// record is one delivery of a batch, with its consumer span once started.
type record struct {
	i int // position in the batch, and of its Result
	delivery
	// ctx and span are the record's consumer span and its context, once started (tracing on);
	// spanDone once it ended with the record's final outcome.
	ctx      context.Context
	span     trace.Span
	spanDone bool
}

// group returns the record's ordering group, "" for none (see delivery.orderingGroup).
func (r *record) group() string { return r.orderingGroup }

// batch is the state of one batch of deliveries (Consumer.run).
type batch struct {
	c       *Consumer
	recs    []record
	results []Result
	blocked map[string]bool // ordering groups with a failure earlier in this batch
}

// precheck returns why r must not be started: a parse error, a blocked ordering group, or too
// little time left. A nil error means go ahead.
func (b *batch) precheck(ctx context.Context, r *record) error {
	if g := r.group(); g != "" && b.blocked[g] {
		return fmt.Errorf("record %s, group %q: %w", r.id, g, ErrGroupBlocked)
	}
	if r.err != nil {
		return r.err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("record %s: %w (%v)", r.id, ErrDeadline, err)
	}
	if dl, ok := ctx.Deadline(); ok && b.c.cfg.DeadlineMargin > 0 {
		if left := dl.Sub(b.c.now()); left < b.c.cfg.DeadlineMargin {
			return fmt.Errorf("record %s: %w (%s left, margin %s)", r.id, ErrDeadline, left.Round(time.Millisecond), b.c.cfg.DeadlineMargin)
		}
	}
	return nil
}

// fail records a failure of r and blocks its ordering group for the rest of the batch.
func (b *batch) fail(r *record, err error) {
	b.results[r.i].Outcome, b.results[r.i].Err = Failed, err
	if g := r.group(); g != "" {
		b.blocked[g] = true
	}
}

func (b *batch) runPerRecord(ctx context.Context) {
	for i := range b.recs {
		r := &b.recs[i]
		b.runOne(b.recordCtx(ctx, r), r)
		b.endSpan(ctx, r) // its own transaction: the outcome is final
	}
}

func (b *batch) runOne(ctx context.Context, r *record) {
	if err := b.precheck(ctx, r); err != nil {
		b.fail(r, err)
		return
	}
	out, err := b.c.applyInTx(ctx, r.msg)
	if err != nil {
		b.fail(r, err)
		return
	}
	b.results[r.i].Outcome = out
}

// applyInTx runs one record in its own transaction and commits it.
func (c *Consumer) applyInTx(ctx context.Context, msg Message) (Outcome, error) {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return Failed, fmt.Errorf("message %s: begin: %w", msg.ID, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	out, err := c.apply(ctx, tx, msg)
	if err != nil {
		return Failed, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Failed, fmt.Errorf("message %s: %w: %w", msg.ID, ErrCommit, err)
	}
	return out, nil
}

// insertSync and insertAsync insert one record's inbox row; a duplicate is found by the primary
// key (ON CONFLICT), so each costs one index probe per index whatever the table's size.
const insertSync = `
INSERT INTO inbox_event (consumer, message_id, event_type, aggregate_type, aggregate_id, group_id,
                         created_at, headers, payload, processed_at)
VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7, $8, $9, clock_timestamp())
ON CONFLICT (consumer, message_id) DO NOTHING`

const insertAsync = `
INSERT INTO inbox_event (consumer, message_id, event_type, aggregate_type, aggregate_id, group_id,
                         created_at, headers, payload)
VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7, $8, $9)
ON CONFLICT (consumer, message_id) DO NOTHING`

// apply inserts the inbox row and, for a new message in a synchronous mode, runs its handler,
// all in tx. It neither commits nor rolls back.
func (c *Consumer) apply(ctx context.Context, tx pgx.Tx, msg Message) (Outcome, error) {
	var created *time.Time
	if !msg.CreatedAt.IsZero() {
		created = &msg.CreatedAt
	}
	var headers map[string]string
	var payload []byte
	query := insertSync
	if c.cfg.Mode == Async {
		query = insertAsync
	}
	headers = map[string]string{}
	if c.cfg.Mode == Async || c.cfg.StorePayload {
		headers, payload = msg.Headers, msg.Payload
	}
	part, err := c.partitioned(ctx, tx)
	if err != nil {
		return Failed, fmt.Errorf("message %s: %w", msg.ID, err)
	}
	args := []any{c.cfg.Consumer, msg.ID, msg.EventType, msg.AggregateType, msg.AggregateID, msg.GroupID, created, headers, payload}
	var tag pgconn.CommandTag
	if part {
		query = insertSyncPartitioned
		if c.cfg.Mode == Async {
			query = insertAsyncPartitioned
		}
		tag, err = c.insertPartitioned(ctx, tx, msg.ID, query, args...)
	} else {
		tag, err = tx.Exec(ctx, query, args...)
	}
	if err != nil {
		c.relearnLayout(err)
		return Failed, fmt.Errorf("message %s: insert inbox row: %w", msg.ID, classify(err))
	}
	if tag.RowsAffected() == 0 {
		return Duplicate, nil
	}
	if c.cfg.Mode == Async {
		return Stored, nil
	}
	h, skip, err := c.cfg.Router.lookup(msg.EventType)
	if err != nil {
		return Failed, fmt.Errorf("message %s: %w", msg.ID, err)
	}
	if skip {
		return Skipped, nil
	}
	if err := runHandler(ctx, h, tx, msg); err != nil {
		return Failed, err
	}
	return Applied, nil
}

// classify marks database errors caused by the message itself (text PostgreSQL cannot store,
// such as a body that is not JSON or \u0000 in a header) as ErrBadMessage.
func classify(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case "22P05", "22021", "22P02", "22025": // untranslatable character, bad encoding, invalid text, bad escape
			return fmt.Errorf("%w: %w", ErrBadMessage, err)
		}
	}
	return err
}

func (c *Consumer) emit(ctx context.Context, rep Report, recs []record) {
	if c.metrics == nil || len(rep.Results) == 0 {
		return
	}
	now := c.now()
	var lat []float64
	for i, res := range rep.Results {
		if created := recs[i].msg.CreatedAt; (res.Outcome == Applied || res.Outcome == Skipped) && !created.IsZero() {
			lat = append(lat, float64(now.Sub(created).Milliseconds()))
		}
	}
	ms := []metrics.Measurement{
		counter(metrics.InboxProcessed, rep.Count(Applied)),
		counter(metrics.InboxSkipped, rep.Count(Skipped)),
		counter(metrics.InboxDuplicates, rep.Count(Duplicate)),
		counter(metrics.InboxFailures, rep.Count(Failed)),
		counter(metrics.InboxDeadLetters, rep.countDead()),
	}
	if c.cfg.Mode == Async {
		ms = append(ms, counter(metrics.InboxStored, rep.Count(Stored)))
	}
	c.metrics.Record(ctx, c.dims, withLatency(ms, lat)...)
}

func counter(m metrics.Metric, n int) metrics.Measurement { return m.Measure(float64(n)) }

// withLatency adds the commit-to-apply latency samples to ms, when there are any.
func withLatency(ms []metrics.Measurement, lat []float64) []metrics.Measurement {
	if len(lat) == 0 {
		return ms
	}
	return append(ms, metrics.CommitToApplyLatency.Observe(lat))
}
