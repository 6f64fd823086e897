package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/emf"
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
	// PollInterval is how long Run sleeps when nothing is ready. Defaults to 1 second.
	PollInterval time.Duration
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics receives Embedded Metric Format lines. Defaults to nil, which writes none.
	Metrics io.Writer
}

// DefaultMaxAttempts is ProcessorConfig.MaxAttempts's default.
const DefaultMaxAttempts = 5

// DefaultBackoff is ProcessorConfig.Backoff's default: 1s, 2s, 4s, ... capped at 5 minutes.
func DefaultBackoff(attempts int) time.Duration {
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
		c.Backoff = DefaultBackoff
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
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
	if c.PollInterval < 0 {
		return fmt.Errorf("%w: PollInterval must not be negative", ErrInvalidConfig)
	}
	return nil
}

// Processor applies the rows the Async mode stored. Several processors (of one or many
// processes) may run at once: each row is claimed with FOR UPDATE SKIP LOCKED, and a FIFO
// message group is applied in arrival order, one row at a time (a parked row blocks its group
// until an operator retries it).
type Processor struct {
	db      Beginner
	cfg     ProcessorConfig
	log     *slog.Logger
	metrics *emf.Logger
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
		metrics: metricsFor(cfg.Metrics, emf.ServiceInboxProcessor, cfg.Consumer)}, nil
}

// metricsFor returns the EMF writer of one inbox consumer's metrics, or nil (no metrics, no
// work) when w is nil.
func metricsFor(w io.Writer, service, consumer string) *emf.Logger {
	if w == nil {
		return nil
	}
	return emf.New(w, map[string]string{emf.DimensionService: service, emf.DimensionConsumer: consumer})
}

// ProcessStats counts what one Drain did.
type ProcessStats struct {
	Applied int // handlers that ran and committed
	Skipped int // unknown event types recorded without effect (SkipUnknown)
	Failed  int // failed attempts (recorded with their error, retried after the backoff)
	Parked  int // rows parked after MaxAttempts failed attempts
}

// claim picks the oldest ready row of the consumer whose message group has no earlier
// unprocessed row, and locks it; rows locked by another processor are skipped.
const claim = `
SELECT e.message_id, e.event_type, e.aggregate_type, e.aggregate_id, coalesce(e.group_id, ''),
       e.created_at, e.headers, coalesce(e.payload, 'null'::jsonb), e.attempts
FROM inbox_event e
WHERE e.consumer = $1
  AND e.processed_at IS NULL AND e.parked_at IS NULL
  AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
  AND (e.group_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM inbox_event g
        WHERE g.consumer = e.consumer AND g.group_id = e.group_id
          AND g.processed_at IS NULL AND g.seq < e.seq))
ORDER BY e.seq
LIMIT 1
FOR UPDATE SKIP LOCKED`

// Drain applies ready rows one transaction each until none is left (rows waiting for their
// backoff or parked do not count) or ctx is done. It returns an error only when the database
// fails; handler failures are recorded on their rows and counted in the stats.
func (p *Processor) Drain(ctx context.Context) (ProcessStats, error) {
	var st ProcessStats
	var lat []float64
	defer func() { p.emit(st, lat) }()
	for ctx.Err() == nil {
		found, res, err := p.one(ctx)
		if err != nil {
			return st, err
		}
		if !found {
			break
		}
		switch res.outcome {
		case Applied:
			st.Applied++
			if !res.created.IsZero() {
				lat = append(lat, float64(time.Since(res.created).Milliseconds()))
			}
		case Skipped:
			st.Skipped++
		case Failed:
			st.Failed++
			if res.parked {
				st.Parked++
			}
		}
	}
	return st, nil
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

// one claims and applies a single row in its own transaction.
func (p *Processor) one(ctx context.Context) (bool, oneResult, error) {
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return false, oneResult{}, fmt.Errorf("inbox processor: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var (
		msg      = Message{IDSource: IDFromAttribute}
		created  *time.Time
		headers  map[string]string
		payload  []byte
		attempts int
	)
	err = tx.QueryRow(ctx, claim, p.cfg.Consumer).Scan(&msg.ID, &msg.EventType, &msg.AggregateType, &msg.AggregateID,
		&msg.GroupID, &created, &headers, &payload, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, oneResult{}, nil
	}
	if err != nil {
		return false, oneResult{}, fmt.Errorf("inbox processor: claim: %w", err)
	}
	if created != nil {
		msg.CreatedAt = created.UTC()
	}
	if headers == nil {
		headers = map[string]string{}
	}
	msg.Headers, msg.Payload = headers, json.RawMessage(payload)
	res := oneResult{created: msg.CreatedAt}

	herr := p.applyStored(ctx, tx, msg)
	if herr == nil {
		res.outcome = Applied
		if _, skip, _ := p.cfg.Router.lookup(msg.EventType); skip {
			res.outcome = Skipped
		}
		if _, err := tx.Exec(ctx, `UPDATE inbox_event SET processed_at = clock_timestamp(), attempts = attempts + 1,
			last_error = NULL, next_attempt_at = NULL WHERE consumer = $1 AND message_id = $2`, p.cfg.Consumer, msg.ID); err != nil {
			return false, oneResult{}, fmt.Errorf("inbox processor: mark %s processed: %w", msg.ID, err)
		}
	} else {
		res.outcome = Failed
		attempts++
		res.parked = attempts >= p.cfg.MaxAttempts
		var next *time.Time
		if !res.parked {
			t := time.Now().Add(p.cfg.Backoff(attempts))
			next = &t
		}
		if _, err := tx.Exec(ctx, `UPDATE inbox_event SET attempts = $3, last_error = $4, next_attempt_at = $5,
			parked_at = CASE WHEN $6 THEN now() END WHERE consumer = $1 AND message_id = $2`,
			p.cfg.Consumer, msg.ID, attempts, truncate(herr.Error(), 4000), next, res.parked); err != nil {
			return false, oneResult{}, fmt.Errorf("inbox processor: record failure of %s: %w", msg.ID, err)
		}
		level := slog.LevelWarn
		if res.parked {
			level = slog.LevelError
		}
		p.log.Log(ctx, level, "inbox: stored message failed", "message_id", msg.ID, "event_type", msg.EventType,
			"attempts", attempts, "parked", res.parked, "error", herr.Error())
	}
	if err := tx.Commit(ctx); err != nil {
		return false, oneResult{}, fmt.Errorf("inbox processor: message %s: %w: %w", msg.ID, ErrCommit, err)
	}
	return true, res, nil
}

// applyStored runs the handler inside a savepoint of tx, so a failure rolls back the effects
// but keeps the row locked while its attempt is recorded.
func (p *Processor) applyStored(ctx context.Context, tx pgx.Tx, msg Message) error {
	h, skip, err := p.cfg.Router.lookup(msg.EventType)
	if err != nil {
		return err
	}
	if skip {
		return nil
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	if err := call(ctx, h, sp, msg); err != nil {
		if rerr := sp.Rollback(context.WithoutCancel(ctx)); rerr != nil {
			return errors.Join(err, fmt.Errorf("rollback to savepoint: %w", rerr))
		}
		var pe *PanicError
		if errors.As(err, &pe) {
			p.log.ErrorContext(ctx, "inbox: handler panicked", "message_id", msg.ID, "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
		}
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

func (p *Processor) emit(st ProcessStats, lat []float64) {
	if p.metrics == nil {
		return
	}
	emitLatency(p.metrics, []emf.Metric{
		{Name: MetricProcessed, Unit: emf.Count, Value: float64(st.Applied)},
		{Name: MetricSkipped, Unit: emf.Count, Value: float64(st.Skipped)},
		{Name: MetricFailures, Unit: emf.Count, Value: float64(st.Failed)},
		{Name: MetricParked, Unit: emf.Count, Value: float64(st.Parked)},
	}, lat)
}
