package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/pkg/metrics"
)

// Dead letters: a record that fails through its own fault is kept in inbox_dead_letter with its
// reason (migrations/0007_inbox_dead_letter.up.sql). The source still owns the record's
// delivery: the consumer reports it failed as before, SQS moves it to the DLQ after
// maxReceiveCount, a stream mapping sends its failure record on. What the table adds is what
// those lack: the error chain and class, the payload (fetched from S3 when a claim check had
// offloaded it), the source coordinates and the failure times, in the database the operator's
// tools read (`sluice dead list`, `sluice dead show`, `sluice dead retry`).
//
// The one place that decides a dead letter is dead is recordFailures: the failure of the last
// attempt its source makes (SQS: ApproximateReceiveCount >= ConsumerConfig.MaxReceiveCount;
// Kinesis and Kafka mappings: the record's recorded failures >= StreamMaxAttempts;
// ConsumeKafka: its give-up, markDead; the Processor: parking a stored row, recordDeadLetter).
// Whether a dead letter was applied since is never stored:
// inbox_event says it (DeadLetterState).

// Error classes of a dead letter (DeadLetter.ErrorClass): what kind of failure its last one was.
const (
	ClassBadMessage       = "bad-message"        // ErrBadMessage: it cannot be parsed or stored
	ClassClaimCheck       = "claim-check"        // ErrClaimCheck: its payload could not be fetched from S3
	ClassUnknownEventType = "unknown-event-type" // ErrUnknownEventType: no handler (FailUnknown)
	ClassHandlerPanic     = "handler-panic"      // ErrHandlerPanic: the handler panicked
	ClassHandler          = "handler-error"      // the handler returned an error
	ClassCommit           = "commit"             // ErrCommit: the work succeeded, the commit failed
	ClassDatabase         = "database"           // a database error outside the handler
	ClassTimeout          = "timeout"            // the context ended while it ran
	ClassUnknownTenant    = "unknown-tenant"     // ErrUnknownTenant: a fleet consumer has no database for it (logged, never recorded)
)

// errorClass names the kind of err (one of the Class constants).
func errorClass(err error) string {
	var pg *pgconn.PgError
	switch {
	case errors.Is(err, ErrBadMessage):
		return ClassBadMessage
	case errors.Is(err, ErrClaimCheck):
		return ClassClaimCheck
	case errors.Is(err, ErrUnknownEventType):
		return ClassUnknownEventType
	case errors.Is(err, ErrUnknownTenant):
		return ClassUnknownTenant
	case errors.Is(err, ErrHandlerPanic):
		return ClassHandlerPanic
	case errors.Is(err, ErrCommit):
		return ClassCommit
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return ClassTimeout
	case errors.As(err, new(*handlerError)):
		return ClassHandler
	case errors.As(err, &pg):
		return ClassDatabase
	}
	return ClassHandler
}

// ErrorLink is one error of a dead letter's chain: its Go type and its message.
type ErrorLink struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// maxChainLinks bounds the chain kept; maxLinkBytes each link's text.
const (
	maxChainLinks = 20
	maxLinkBytes  = 2000
)

// errorChain returns err and the errors it wraps, outermost first, depth first through joined
// errors, at most maxChainLinks.
func errorChain(err error) []ErrorLink {
	var out []ErrorLink
	var walk func(error)
	walk = func(e error) {
		if e == nil || len(out) >= maxChainLinks {
			return
		}
		out = append(out, ErrorLink{Type: fmt.Sprintf("%T", e), Text: truncate(e.Error(), maxLinkBytes)})
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				walk(inner)
			}
		}
	}
	walk(err)
	return out
}

// recordDeadLetterSQL upserts one failed record's dead letter ($1 consumer, $2 record key, ...,
// $18 dead: the source makes no further attempt, $19 the attempt count that makes it dead, 0
// for none). It returns whether the row is dead now.
const recordDeadLetterSQL = `
INSERT INTO inbox_dead_letter AS d (consumer, record_key, message_id, event_type, aggregate_type, aggregate_id,
    group_id, created_at, source, source_name, source_position, receive_count, error_class, error_text,
    error_chain, headers, payload, first_failed_at, last_failed_at, dead_at)
VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, ''), $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
    clock_timestamp(), clock_timestamp(),
    CASE WHEN $18 OR ($19 > 0 AND $19 <= 1) THEN clock_timestamp() END)
ON CONFLICT (consumer, record_key) DO UPDATE SET
    message_id = EXCLUDED.message_id, event_type = EXCLUDED.event_type,
    aggregate_type = EXCLUDED.aggregate_type, aggregate_id = EXCLUDED.aggregate_id,
    group_id = EXCLUDED.group_id, created_at = EXCLUDED.created_at, source = EXCLUDED.source,
    source_name = EXCLUDED.source_name, source_position = EXCLUDED.source_position,
    receive_count = EXCLUDED.receive_count, attempts = d.attempts + 1,
    error_class = EXCLUDED.error_class, error_text = EXCLUDED.error_text,
    error_chain = EXCLUDED.error_chain, headers = EXCLUDED.headers, payload = EXCLUDED.payload,
    last_failed_at = EXCLUDED.last_failed_at,
    dead_at = CASE WHEN $18 OR ($19 > 0 AND d.attempts + 1 >= $19) THEN clock_timestamp() END
RETURNING dead_at IS NOT NULL`

// markDeadSQL marks a recorded dead letter dead (ConsumeKafka's give-up).
const markDeadSQL = `
UPDATE inbox_dead_letter SET dead_at = clock_timestamp()
WHERE consumer = $1 AND record_key = $2 AND dead_at IS NULL`

// recordKey is the dead letter's key for a delivery: its message id, or for a record that
// could not be parsed, where it came from.
func (d *delivery) recordKey() string {
	if d.err == nil && d.msg.ID != "" {
		return d.msg.ID
	}
	return d.sourceName + "/" + d.position
}

// failure is one failed attempt of a record (or of a stored row), as its dead letter keeps it.
type failure struct {
	key string
	// msg is the parsed message; nil when the record could not be parsed, whose body is raw.
	msg *Message
	raw []byte
	// source, sourceName and position: see the inbox_dead_letter columns.
	source, sourceName, position string
	receiveCount                 int // 0: the source gives none
	err                          error
	// deadNow: the source makes no further attempt; deadAfter: dead once this many failures
	// are recorded (0: never by count).
	deadNow   bool
	deadAfter int
}

// queue adds f's upsert (recordDeadLetterSQL) to b; dead receives whether the row is dead now.
func (f failure) queue(b *pgx.Batch, consumer string, dead *bool) {
	var (
		messageID                        *string
		eventType, aggType, aggID, group string
		created                          any
		headers                          = map[string]string{}
		payload                          *string
		receiveCount                     *int
	)
	if f.msg != nil {
		id := f.msg.ID
		messageID = &id
		eventType, aggType, aggID, group = f.msg.EventType, f.msg.AggregateType, f.msg.AggregateID, f.msg.GroupID
		if !f.msg.CreatedAt.IsZero() {
			created = f.msg.CreatedAt
		}
		for k, v := range f.msg.Headers {
			headers[truncate(k, maxLinkBytes)] = truncate(v, maxLinkBytes)
		}
		if f.msg.Payload != nil {
			p := truncate(string(f.msg.Payload), maxDeadLetterPayload)
			payload = &p
		}
	} else if f.raw != nil {
		p := truncate(string(f.raw), maxDeadLetterPayload)
		payload = &p
	}
	if f.receiveCount > 0 {
		n := f.receiveCount
		receiveCount = &n
	}
	chain, _ := json.Marshal(errorChain(f.err))
	b.Queue(recordDeadLetterSQL, consumer, truncate(f.key, 1000), messageID, eventType, aggType, aggID,
		group, created, f.source, f.sourceName, f.position, receiveCount, errorClass(f.err),
		truncate(f.err.Error(), maxErrorBytes), string(chain), headers, payload, f.deadNow, f.deadAfter).
		QueryRow(func(row pgx.Row) error { return row.Scan(dead) })
}

// sendBatch sends b on db (see statements) in one round trip.
func sendBatch(ctx context.Context, db Beginner, b *pgx.Batch) error {
	return statements(ctx, db, func(q Querier) error {
		sb, ok := q.(interface {
			SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
		})
		if !ok {
			return fmt.Errorf("%T cannot send a batch", q)
		}
		return sb.SendBatch(ctx, b).Close()
	})
}

// notItsFault reports a failure that says nothing of the record: it was not attempted (an
// earlier record of its group failed, too little time was left). It is not a dead letter.
func notItsFault(err error) bool {
	return errors.Is(err, ErrGroupBlocked) || errors.Is(err, ErrDeadline)
}

// lastAttempt returns, for the deliveries of one source, how the consumer knows a failure is
// the last (see the comment at the top of this file): dead now (SQS: from the receive count),
// or after this many recorded failures (0: never by count).
func (c *Consumer) lastAttempt(d *delivery) (deadNow bool, after int) {
	switch {
	case d.selfManaged:
		return false, 0 // ConsumeKafka decides (markDead)
	case d.source == sourceSQS:
		return d.receiveCount > 0 && d.receiveCount >= c.cfg.SQSMaxReceiveCount, 0
	default:
		return false, c.cfg.StreamMaxAttempts
	}
}

// recordFailures keeps a dead letter for every record of the batch that failed through its own
// fault, in one round trip after the batch's transactions ended, and marks the results of the
// records that are dead now. A failure to record is logged and changes no outcome: the source
// still holds the record.
func (b *batch) recordFailures(ctx context.Context) {
	type row struct {
		rec *record
		res *Result
	}
	var todo []row
	for i := range b.recs {
		if res := &b.results[i]; res.Outcome == Failed && !notItsFault(res.Err) {
			todo = append(todo, row{&b.recs[i], res})
		}
	}
	if len(todo) == 0 {
		return
	}
	c := b.c
	q := &pgx.Batch{}
	for _, t := range todo {
		d := &t.rec.delivery
		deadNow, after := c.lastAttempt(d)
		f := failure{key: d.recordKey(), source: d.source, sourceName: d.sourceName, position: d.position,
			receiveCount: d.receiveCount, err: t.res.Err, deadNow: deadNow, deadAfter: after}
		if d.err == nil {
			f.msg = &d.msg
		} else {
			f.raw = d.raw
		}
		f.queue(q, c.cfg.Consumer, &t.res.Dead)
	}
	if err := sendBatch(context.WithoutCancel(ctx), c.db, q); err != nil {
		c.log.WarnContext(ctx, "inbox: could not record dead letters; the records' sources still hold them", "records", len(todo), "error", err.Error())
		for _, t := range todo {
			t.res.Dead = false
		}
		return
	}
	for _, t := range todo {
		if t.res.Dead {
			c.log.ErrorContext(ctx, "inbox: record failed its last attempt; kept as a dead letter (sluice dead list)",
				"item_id", t.res.ItemID, "message_id", t.res.MessageID, "event_type", t.res.EventType, "error", t.res.Err.Error())
		}
	}
}

// maxDeadLetterPayload bounds the payload kept with a dead letter (the largest an SQS message
// or a claim-checked payload fetched within ClaimCheck.MaxPayloadBytes can be is far below
// PostgreSQL's 1 GB for a text value; this keeps a runaway record from bloating the table).
const maxDeadLetterPayload = 64 << 20

// markDead marks the dead letter of d dead: ConsumeKafka moved it to its dead-letter topic and
// goes on. It reports whether a row changed.
func (c *Consumer) markDead(ctx context.Context, d *delivery) bool {
	if c.tenants != nil {
		return c.markDeadInTenant(ctx, d)
	}
	var changed bool
	err := statements(context.WithoutCancel(ctx), c.db, func(db Querier) error {
		tag, err := db.Exec(context.WithoutCancel(ctx), markDeadSQL, c.cfg.Consumer, truncate(d.recordKey(), 1000))
		changed = tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		c.log.WarnContext(ctx, "inbox: could not mark a dead letter dead", "item_id", d.id, "error", err.Error())
		return false
	}
	if changed && c.metrics != nil {
		c.metrics.Record(context.WithoutCancel(ctx), c.dims, counter(metrics.InboxDeadLetters, 1))
	}
	return changed
}

// statements runs f with a Querier for single statements: db itself when it can run them (a
// pool, a conn, a tx), otherwise a short transaction of its own.
func statements(ctx context.Context, db Beginner, f func(Querier) error) error {
	if q, ok := db.(Querier); ok {
		return f(q)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return f(tx) })
}
