package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/pkg/metrics"
)

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	// Consumer is the consumer name whose stored rows this processor applies. Required.
	Consumer string
	// Router maps event types to handlers; its OnUnknown policy applies. Required.
	Router *Router
	// MaxAttempts: a row whose handler failed this many times is parked for an operator
	// (see ListParked, RetryParked). Defaults to 5.
	MaxAttempts int
	// Backoff returns how long to wait before the next attempt after the given number of failed
	// attempts. Defaults to exponential backoff from 1 second, capped at 5 minutes.
	Backoff func(attempts int) time.Duration
	// BatchSize is how many rows one claim returns: up to BatchSize rows of FIFO groups and up
	// to BatchSize rows without a group. Each row is still applied in its own transaction.
	// Defaults to 100; at most 10,000.
	BatchSize int
	// PollInterval is how long Run sleeps when nothing is ready. Defaults to 1 second.
	PollInterval time.Duration
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics receives Embedded Metric Format lines: a shorthand for MetricsRecorder:
	// metrics.NewEMF(Metrics). Defaults to nil, which writes none.
	Metrics io.Writer
	// MetricsRecorder receives the processor's metrics (the inbox metrics of pkg/metrics, with
	// dimensions {Service: inbox-processor, Consumer: <name>}) once per Drain. When Metrics is
	// set too, both receive everything. Defaults to none.
	MetricsRecorder metrics.Recorder
	// TracerProvider records a consumer span per applied row, linked to the span that wrote
	// the event (read from the stored headers); handlers get its context. Defaults to none: no
	// spans, no cost.
	TracerProvider trace.TracerProvider
	// TraceAsChild makes each row's span a child of the writer's span instead, as
	// ConsumerConfig.TraceAsChild does. Defaults to false.
	TraceAsChild bool
	// Propagator reads the writer's span context from the stored headers. Defaults to W3C
	// trace context (propagation.TraceContext), what outbox.Write injects.
	Propagator propagation.TextMapPropagator
}

// DefaultMaxAttempts is ProcessorConfig.MaxAttempts's default.
const DefaultMaxAttempts = 5

// DefaultBatchSize is ProcessorConfig.BatchSize's default.
const DefaultBatchSize = 100

// maxBatchSize bounds ProcessorConfig.BatchSize.
const maxBatchSize = 10_000

// defaultBackoff is ProcessorConfig.Backoff's default: 1s, 2s, 4s, ... capped at 5 minutes.
func defaultBackoff(attempts int) time.Duration {
	if attempts < 1 {
		attempts = 1
	}
	if attempts > 9 {
		return 5 * time.Minute
	}
	return min(time.Second<<(attempts-1), 5*time.Minute)
}

// WithDefaults returns a copy of c with every zero field set to its documented default.
func (c ProcessorConfig) WithDefaults() ProcessorConfig {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Backoff == nil {
		c.Backoff = defaultBackoff
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Propagator == nil {
		c.Propagator = defaultPropagator
	}
	return c
}

func (c ProcessorConfig) validate() error {
	if err := validateConsumer(c.Consumer); err != nil {
		return err
	}
	if c.Router == nil {
		return fmt.Errorf("%w: Router is required", ErrInvalidConfig)
	}
	if c.MaxAttempts < 1 {
		return fmt.Errorf("%w: MaxAttempts must be at least 1, got %d", ErrInvalidConfig, c.MaxAttempts)
	}
	if c.BatchSize < 1 || c.BatchSize > maxBatchSize {
		return fmt.Errorf("%w: BatchSize must be between 1 and %d, got %d", ErrInvalidConfig, maxBatchSize, c.BatchSize)
	}
	if c.PollInterval < 0 {
		return fmt.Errorf("%w: PollInterval must not be negative", ErrInvalidConfig)
	}
	return nil
}

// Processor applies the rows the Async mode stored. It claims ready rows in batches and applies
// each in its own transaction, which locks the row with FOR UPDATE SKIP LOCKED, so several
// processors (of one or many processes) may run at once. A FIFO message group is applied in
// arrival order, one row at a time (a parked row blocks its group until an operator retries
// it); a parked or backing-off group costs other groups nothing, however many rows wait behind
// it. See docs/inbox.md, "How the asynchronous processor works".
type Processor struct {
	db      Beginner
	cfg     ProcessorConfig
	log     *slog.Logger
	metrics metrics.Recorder
	dims    metrics.Dimensions
	tracing *tracing // nil: tracing off
}

// NewProcessor returns a Processor that opens its transactions on db (usually a *pgxpool.Pool).
func NewProcessor(db Beginner, cfg ProcessorConfig) (*Processor, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Processor{db: db, cfg: cfg, log: cfg.Logger.With("consumer", cfg.Consumer),
		metrics: recorder(cfg.Metrics, cfg.MetricsRecorder),
		dims:    dimensions(metrics.ServiceInboxProcessor, cfg.Consumer),
		tracing: newTracing(cfg.TracerProvider, cfg.Propagator, cfg.Consumer, "processor", cfg.TraceAsChild),
	}, nil
}

// ProcessStats counts what one Drain did.
type ProcessStats struct {
	Applied int // handlers that ran and committed
	Skipped int // unknown event types recorded without effect (SkipUnknown)
	Failed  int // failed attempts (recorded with their error, retried after the backoff)
	Parked  int // rows parked after MaxAttempts failed attempts
}

// The Processor's statements. Each one's cost is bounded by construction, whatever the planner
// statistics say: every table access is an index scan with equality on the consumer and a LIMIT,
// or a primary-key lookup, and the only joins are LATERAL (nested loops, one index descent per
// outer row). None of them reads the rows waiting behind a parked or backing-off FIFO head.

// claimSQL returns the keys of up to $3 ready FIFO rows and up to $3 ready rows without a group
// ($1 consumer, $2 the FIFO group to continue after, "" for the first). It takes no locks: each
// row is locked, and checked again, by lockSQL in the transaction that applies it.
//
//   - groups walks the consumer's FIFO groups in index order from $2 with a skip scan of
//     inbox_event_unprocessed_group_idx: one descent per group to its first unprocessed row (its
//     head, parked or not), never reading the rows behind it. The recursion is lazy: it stops
//     as soon as the outer LIMIT has its rows, so its cost is one descent per group visited.
//   - From each group whose head is ready (not parked, backoff over), the head and the rows
//     after it, in seq order: one index range scan with LIMIT $3.
//   - Rows without a group come from inbox_event_ready_idx in the order they became ready
//     (coalesce(next_attempt_at, received_at)); the range <= now() holds only ready rows, so rows
//     in backoff and FIFO rows cost nothing. LIMIT $3.
//
// The result (at most 2 x $3 rows) is sorted FIFO rows first, in the groups' index order, so the
// caller can continue the next claim after the last group it received.
const claimSQL = `
WITH RECURSIVE groups AS (
    (SELECT e.group_id, e.seq, e.parked_at, e.next_attempt_at
     FROM inbox_event e
     WHERE e.consumer = $1 AND e.group_id > $2
       AND e.processed_at IS NULL AND e.group_id IS NOT NULL
     ORDER BY e.group_id, e.seq
     LIMIT 1)
    UNION ALL
    SELECT n.* FROM groups h CROSS JOIN LATERAL (
        SELECT e.group_id, e.seq, e.parked_at, e.next_attempt_at
        FROM inbox_event e
        WHERE e.consumer = $1 AND e.group_id > h.group_id
          AND e.processed_at IS NULL AND e.group_id IS NOT NULL
        ORDER BY e.group_id, e.seq
        LIMIT 1) n
)
SELECT c.message_id, coalesce(c.group_id, ''), c.seq FROM (
    (SELECT 0 AS part, r.message_id, r.group_id, r.seq
     FROM groups h CROSS JOIN LATERAL (
         SELECT e.message_id, e.group_id, e.seq
         FROM inbox_event e
         WHERE e.consumer = $1 AND e.group_id = h.group_id AND e.seq >= h.seq
           AND e.processed_at IS NULL AND e.group_id IS NOT NULL
         ORDER BY e.seq
         LIMIT $3) r
     WHERE h.parked_at IS NULL AND (h.next_attempt_at IS NULL OR h.next_attempt_at <= now())
     LIMIT $3)
    UNION ALL
    (SELECT 1, e.message_id, e.group_id, e.seq
     FROM inbox_event e
     WHERE e.consumer = $1 AND e.group_id IS NULL
       AND e.processed_at IS NULL AND e.parked_at IS NULL
       AND coalesce(e.next_attempt_at, e.received_at) <= now()
     ORDER BY coalesce(e.next_attempt_at, e.received_at), e.seq
     LIMIT $3)
) c
ORDER BY c.part, c.group_id, c.seq`

// lockSQL locks one claimed row ($1 consumer, $2 message id) for the transaction that applies
// it and reads it, provided it is still ready: unprocessed, not parked, its backoff over, not
// locked by another processor (SKIP LOCKED), and the first unprocessed row of its FIFO group.
// The group check reads inbox_event_unprocessed_group_idx between $3 and the row's seq; $3 is
// the seq of the group's row this processor applied just before (0 for none), so the check
// does not re-read the entries that row left behind. A primary-key lookup plus one range scan.
const lockSQL = `
SELECT e.event_type, e.aggregate_type, e.aggregate_id, coalesce(e.group_id, ''), e.created_at,
       e.headers, coalesce(e.payload, 'null'::json)::text, e.attempts
FROM inbox_event e
WHERE e.consumer = $1 AND e.message_id = $2
  AND e.processed_at IS NULL AND e.parked_at IS NULL
  AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
  AND (e.group_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM inbox_event g
        WHERE g.consumer = e.consumer AND g.group_id = e.group_id
          AND g.processed_at IS NULL AND g.group_id IS NOT NULL
          AND g.seq > $3 AND g.seq < e.seq))
FOR UPDATE OF e SKIP LOCKED`

// markProcessedSQL completes a row in the transaction of its effects. A primary-key update.
const markProcessedSQL = `
UPDATE inbox_event
SET processed_at = clock_timestamp(), attempts = attempts + 1, last_error = NULL, next_attempt_at = NULL
WHERE consumer = $1 AND message_id = $2`

// recordFailureSQL records a failed attempt in a statement of its own, after the attempt's
// transaction was rolled back ($3 the attempts read when the row was locked, $4 the error text,
// $5 park it, $6 the backoff in seconds). It changes nothing when another processor moved the
// row on in between (applied it, or recorded that attempt). A primary-key update.
const recordFailureSQL = `
UPDATE inbox_event
SET attempts = attempts + 1, last_error = $4,
    next_attempt_at = CASE WHEN $5 THEN NULL ELSE clock_timestamp() + make_interval(secs => $6) END,
    parked_at = CASE WHEN $5 THEN clock_timestamp() END
WHERE consumer = $1 AND message_id = $2
  AND processed_at IS NULL AND parked_at IS NULL AND attempts = $3`

// maxErrorBytes bounds the error text kept in last_error.
const maxErrorBytes = 4000

// claimed is one row returned by claimSQL.
type claimed struct {
	id    string
	group string // "" without a FIFO group
	seq   int64
}

// claimedBatch is what one claim returned.
type claimedBatch struct {
	rows []claimed
	// more: the FIFO part was full, so groups after the last one returned may hold ready rows.
	more      bool
	lastGroup string
}

// claim returns the keys of up to BatchSize ready FIFO rows, from the groups after the group
// after, and up to BatchSize ready rows without a group. It locks nothing.
func (p *Processor) claim(ctx context.Context, after string) (claimedBatch, error) {
	var b claimedBatch
	err := statements(ctx, p.db, func(q Querier) error {
		rows, err := q.Query(ctx, claimSQL, p.cfg.Consumer, after, p.cfg.BatchSize)
		if err != nil {
			return err
		}
		b.rows, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
			var c claimed
			err := r.Scan(&c.id, &c.group, &c.seq)
			return c, err
		})
		return err
	})
	if err != nil {
		return claimedBatch{}, fmt.Errorf("inbox processor: claim: %w", err)
	}
	grouped := 0
	for _, c := range b.rows {
		if c.group != "" {
			grouped++
			b.lastGroup = c.group
		}
	}
	b.more = grouped >= p.cfg.BatchSize
	return b, nil
}

// Drain applies ready rows, each in its own transaction, until none is left that this
// processor can take (rows waiting for their backoff, parked rows, the rows behind them in
// their FIFO group and rows another processor is applying do not count) or ctx is done. It
// returns an error only when the database fails; handler failures, including a handler that
// returned nil after a failed statement and a failed commit, are recorded on their rows and
// counted in the stats.
//
// It claims BatchSize rows at a time. Each claim continues after the last FIFO group the
// previous one returned, so groups take turns; a pass ends when a claim reaches the last group,
// and Drain returns after a pass in which it could take nothing.
func (p *Processor) Drain(ctx context.Context) (ProcessStats, error) {
	var st ProcessStats
	var lat []float64
	defer func() { p.emit(ctx, st, lat) }()
	after, progressed := "", false
	for ctx.Err() == nil {
		b, err := p.claim(ctx, after)
		if err != nil {
			return st, err
		}
		moved, err := p.applyBatch(ctx, b.rows, &st, &lat)
		if err != nil {
			return st, err
		}
		progressed = progressed || moved
		if b.more {
			after = b.lastGroup
			continue
		}
		if !progressed {
			break
		}
		after, progressed = "", false
	}
	return st, nil
}

// applyBatch applies claimed rows in order, each in its own transaction, and reports whether it
// took any. A FIFO group's rows stop at the first one that fails or cannot be taken; they wait
// for a later claim.
func (p *Processor) applyBatch(ctx context.Context, rows []claimed, st *ProcessStats, lat *[]float64) (bool, error) {
	took := false
	prev := map[string]int64{}   // group -> seq of its row applied just before in this batch
	stopped := map[string]bool{} // groups whose next row waits for a later claim
	for _, c := range rows {
		if ctx.Err() != nil {
			break
		}
		if c.group != "" && stopped[c.group] {
			continue
		}
		res, taken, err := p.one(ctx, c, prev[c.group])
		if err != nil {
			return took, err
		}
		if !taken {
			stopped[c.group] = c.group != ""
			continue
		}
		took = true
		switch res.outcome {
		case Applied:
			st.Applied++
			if !res.created.IsZero() {
				*lat = append(*lat, float64(time.Since(res.created).Milliseconds()))
			}
		case Skipped:
			st.Skipped++
		case Failed:
			st.Failed++
			if res.parked {
				st.Parked++
			}
			stopped[c.group] = c.group != ""
			continue
		}
		if c.group != "" {
			prev[c.group] = c.seq
		}
	}
	return took, nil
}

// Run drains, then polls every PollInterval, until ctx is done; it returns ctx's error then,
// or the first database error.
func (p *Processor) Run(ctx context.Context) error {
	for {
		if _, err := p.Drain(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.cfg.PollInterval):
		}
	}
}

type oneResult struct {
	outcome Outcome
	parked  bool
	created time.Time
}

// one applies the claimed row c in its own transaction: lock it (lockSQL; taken is false when
// it is no longer ready), run its handler, mark it processed, commit. When anything of that
// fails (the handler's error or panic, a handler that swallowed a failed statement, the
// commit), the transaction is rolled back whole and the failure is recorded in a statement of
// its own, so a transaction that can no longer write cannot keep the row from being retried,
// and eventually parked. afterSeq is the seq of the row of c's group this processor applied
// just before (see lockSQL).
func (p *Processor) one(ctx context.Context, c claimed, afterSeq int64) (res oneResult, taken bool, err error) {
	started := time.Now()
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return res, false, fmt.Errorf("inbox processor: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var (
		msg      = Message{ID: c.id, IDSource: IDFromAttribute}
		created  *time.Time
		headers  map[string]string
		payload  []byte
		attempts int
	)
	err = tx.QueryRow(ctx, lockSQL, p.cfg.Consumer, c.id, afterSeq).Scan(&msg.EventType, &msg.AggregateType,
		&msg.AggregateID, &msg.GroupID, &created, &headers, &payload, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, false, nil // applied, locked, parked or backing off meanwhile, or not its group's head
	}
	if err != nil {
		return res, false, fmt.Errorf("inbox processor: lock %s: %w", c.id, err)
	}
	if created != nil {
		msg.CreatedAt = created.UTC()
	}
	if headers == nil {
		headers = map[string]string{}
	}
	msg.Headers, msg.Payload = headers, json.RawMessage(payload)
	res.created = msg.CreatedAt

	var herr error // the attempt's failure
	if p.tracing != nil {
		var span trace.Span
		ctx, span = p.tracing.start(ctx, msg, "", "", started)
		defer func() {
			if err != nil && herr == nil {
				herr = err
			}
			p.tracing.end(span, msg, res.outcome, herr, time.Now(), otelattr.Bool(spanAttrParked, res.parked))
		}()
	}
	res.outcome = Applied
	h, skip, herr := p.cfg.Router.lookup(msg.EventType)
	if herr != nil {
		herr = fmt.Errorf("message %s: %w", msg.ID, herr)
	} else if skip {
		res.outcome = Skipped
	} else {
		herr = runHandler(ctx, h, tx, msg)
	}
	if herr == nil {
		if _, err := tx.Exec(ctx, markProcessedSQL, p.cfg.Consumer, msg.ID); err != nil {
			herr = fmt.Errorf("message %s: mark processed: %w", msg.ID, err)
		}
	}
	if herr == nil {
		if err := tx.Commit(ctx); err != nil {
			herr = fmt.Errorf("message %s: %w: %w", msg.ID, ErrCommit, err)
		}
	}
	if herr == nil {
		return res, true, nil
	}

	_ = tx.Rollback(context.WithoutCancel(ctx))
	if ctx.Err() != nil {
		return oneResult{}, false, nil // stopping: the attempt is not the message's fault, not counted
	}
	var pe *PanicError
	if errors.As(herr, &pe) {
		p.log.ErrorContext(ctx, "inbox: handler panicked", "message_id", msg.ID, "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
	}
	res.outcome = Failed
	res.parked = attempts+1 >= p.cfg.MaxAttempts
	var recorded bool
	err = statements(ctx, p.db, func(q Querier) error {
		tag, err := q.Exec(ctx, recordFailureSQL, p.cfg.Consumer, msg.ID, attempts,
			truncate(herr.Error(), maxErrorBytes), res.parked, p.cfg.Backoff(attempts+1).Seconds())
		recorded = tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		return res, true, fmt.Errorf("inbox processor: record failure of %s: %w", msg.ID, err)
	}
	res.parked = res.parked && recorded
	if recorded {
		p.recordDeadLetter(ctx, c, msg, herr, res.parked)
	}
	level := slog.LevelWarn
	if res.parked {
		level = slog.LevelError
	}
	p.log.Log(ctx, level, "inbox: stored message failed", "message_id", msg.ID, "event_type", msg.EventType,
		"attempts", attempts+1, "parked", res.parked, "recorded", recorded, "error", herr.Error())
	return res, true, nil
}

// recordDeadLetter keeps the failed attempt of the stored row c in its dead letter (source
// "inbox"), dead when it was parked: its class and error chain beside the row's last error. Best
// effort, as the consumer's: a failure to record is logged.
func (p *Processor) recordDeadLetter(ctx context.Context, c claimed, msg Message, err error, parked bool) {
	b := &pgx.Batch{}
	var dead bool
	failure{key: msg.ID, msg: &msg, source: sourceInbox, sourceName: "inbox_event", position: strconv.FormatInt(c.seq, 10),
		err: err, deadNow: parked}.queue(b, p.cfg.Consumer, &dead)
	if serr := sendBatch(context.WithoutCancel(ctx), p.db, b); serr != nil {
		p.log.WarnContext(ctx, "inbox: could not record the dead letter of a stored row", "message_id", msg.ID, "error", serr.Error())
	}
}

func (p *Processor) emit(ctx context.Context, st ProcessStats, lat []float64) {
	if p.metrics == nil {
		return
	}
	p.metrics.Record(context.WithoutCancel(ctx), p.dims, withLatency([]metrics.Measurement{
		counter(metrics.InboxProcessed, st.Applied),
		counter(metrics.InboxSkipped, st.Skipped),
		counter(metrics.InboxFailures, st.Failed),
		counter(metrics.InboxParked, st.Parked),
	}, lat)...)
}
