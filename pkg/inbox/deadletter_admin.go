package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeadLetterState is where a dead letter stands, read from inbox_event when it is listed (the
// inbox row, not the dead letter, says whether the message was applied).
type DeadLetterState string

// The states of a dead letter.
const (
	// DeadFailing: it failed and its source still retries it.
	DeadFailing DeadLetterState = "failing"
	// DeadDead: it failed its source's last attempt (it is in the DLQ, or past a stream
	// mapping's or ConsumeKafka's retries) and nothing applied it since.
	DeadDead DeadLetterState = "dead"
	// DeadRetrying: `sluice dead retry` stored it in inbox_event and the processor has not
	// applied it yet.
	DeadRetrying DeadLetterState = "retrying"
	// DeadParked: stored for the processor, which gave up on it too (ListParked).
	DeadParked DeadLetterState = "parked"
	// DeadApplied: the inbox holds it applied (by a retry, a redriven copy or a later delivery).
	DeadApplied DeadLetterState = "applied"
)

// DeadLetter is a record a consumer failed on, with why (inbox_dead_letter).
type DeadLetter struct {
	Consumer string `json:"consumer"`
	// Key identifies it: the message id, or SOURCE_NAME/POSITION for a record that could not be
	// parsed (then MessageID is empty and it cannot be retried through the inbox).
	Key       string `json:"key"`
	MessageID string `json:"message_id,omitempty"`
	EventType string `json:"event_type,omitempty"`
	GroupID   string `json:"group_id,omitempty"`
	// Source is aws:sqs, aws:kinesis or kafka; SourceName the SQS queue ARN, the Kinesis stream
	// ARN or the Kafka topic; SourcePosition the SQS message id, the Kinesis SHARD/SEQUENCE or
	// the Kafka PARTITION@OFFSET of its last failure. A stored row the Processor failed on has
	// Source "inbox", SourceName "inbox_event" and its seq as SourcePosition.
	Source         string `json:"source"`
	SourceName     string `json:"source_name"`
	SourcePosition string `json:"source_position"`
	// ReceiveCount is SQS's ApproximateReceiveCount at the last failure; 0 for Kinesis and
	// Kafka, which give none.
	ReceiveCount int `json:"receive_count,omitempty"`
	// Attempts counts the failures recorded.
	Attempts int `json:"attempts"`
	// ErrorClass is one of the Class constants; Error the last failure's text; ErrorChain the
	// errors it wrapped, outermost first.
	ErrorClass string            `json:"error_class"`
	Error      string            `json:"error"`
	ErrorChain []ErrorLink       `json:"error_chain"`
	Headers    map[string]string `json:"headers"`
	// Payload is what the handler got (fetched from S3 when a claim check had offloaded it), or
	// the raw body of a record that could not be parsed; empty when there was none.
	Payload       string     `json:"payload"`
	FirstFailedAt time.Time  `json:"first_failed_at"`
	LastFailedAt  time.Time  `json:"last_failed_at"`
	DeadAt        *time.Time `json:"dead_at,omitempty"`
	RetriedAt     *time.Time `json:"retried_at,omitempty"`
	// State is read from inbox_event when listed.
	State DeadLetterState `json:"state"`
}

// DeadLetterFilter chooses the dead letters ListDeadLetters returns.
type DeadLetterFilter struct {
	// Consumer narrows the list to one consumer. Defaults to "" (every consumer).
	Consumer string
	// Keys narrows the list to these keys (with Consumer). Defaults to none: every key.
	Keys []string
	// IncludeApplied lists the dead letters the inbox applied since too. Defaults to false.
	IncludeApplied bool
	// Limit is the most returned. Defaults to 100 (0 or less).
	Limit int
}

// deadLetterStateSQL is a dead letter's state (DeadLetterState), read from inbox_event: one
// primary-key lookup per dead letter (dead letters are few: records that failed). It ends a
// SELECT list over inbox_dead_letter d.
const deadLetterStateSQL = `
           CASE WHEN i.processed_at IS NOT NULL THEN 'applied'
                WHEN i.parked_at IS NOT NULL THEN 'parked'
                WHEN i.found THEN 'retrying'
                WHEN d.dead_at IS NOT NULL THEN 'dead'
                ELSE 'failing' END AS state
    FROM inbox_dead_letter d
    LEFT JOIN LATERAL (
        SELECT true AS found, e.processed_at, e.parked_at FROM inbox_event e
        WHERE e.consumer = d.consumer AND e.message_id = d.message_id
        LIMIT 1) i ON true`

// listDeadLettersSQL reads dead letters with their state.
const listDeadLettersSQL = `
SELECT * FROM (
    SELECT d.consumer, d.record_key, coalesce(d.message_id, ''), d.event_type, coalesce(d.group_id, ''),
           d.source, d.source_name, d.source_position, coalesce(d.receive_count, 0), d.attempts,
           d.error_class, d.error_text, d.error_chain, d.headers, coalesce(d.payload, ''),
           d.first_failed_at, d.last_failed_at, d.dead_at, d.retried_at,` + deadLetterStateSQL + `
    WHERE ($1 = '' OR d.consumer = $1) AND ($2::text[] IS NULL OR d.record_key = ANY($2::text[]))
) l
WHERE $3 OR l.state <> 'applied'
ORDER BY l.last_failed_at DESC, l.consumer, l.record_key
LIMIT $4`

// DeadLetterCount is how many dead letters of a consumer are in a state.
type DeadLetterCount struct {
	Consumer string          `json:"consumer"`
	State    DeadLetterState `json:"state"`
	Count    int64           `json:"count"`
}

// CountDeadLetters counts every consumer's dead letters by state, the applied ones included, by
// consumer and state, without reading their payloads. ListDeadLetters lists them.
func CountDeadLetters(ctx context.Context, db Querier) ([]DeadLetterCount, error) {
	rows, err := db.Query(ctx, `SELECT consumer, state, count(*) FROM (SELECT d.consumer,`+deadLetterStateSQL+`) l
		GROUP BY consumer, state ORDER BY consumer, state`)
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterCount, error) {
		var c DeadLetterCount
		var state string
		err := r.Scan(&c.Consumer, &state, &c.Count)
		c.State = DeadLetterState(state)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	return out, nil
}

// ListDeadLetters returns the dead letters f chooses, the most recent failure first, each with
// its state (DeadLetterState). ListParked lists the processor's parked rows.
func ListDeadLetters(ctx context.Context, db Querier, f DeadLetterFilter) ([]DeadLetter, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var keys []string
	if len(f.Keys) > 0 {
		keys = f.Keys
	}
	rows, err := db.Query(ctx, listDeadLettersSQL, f.Consumer, keys, f.IncludeApplied, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var state string
		err := r.Scan(&d.Consumer, &d.Key, &d.MessageID, &d.EventType, &d.GroupID, &d.Source, &d.SourceName,
			&d.SourcePosition, &d.ReceiveCount, &d.Attempts, &d.ErrorClass, &d.Error, &d.ErrorChain, &d.Headers,
			&d.Payload, &d.FirstFailedAt, &d.LastFailedAt, &d.DeadAt, &d.RetriedAt, &state)
		d.State = DeadLetterState(state)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// DeadLetterRetry is what RetryDeadLetters did with each dead letter it was given, by key.
type DeadLetterRetry struct {
	// Stored: stored in inbox_event for the processor, which applies it with the consumer's
	// handlers (the consumer Lambda's schedule, or an inbox.Processor you run).
	Stored []string
	// AlreadyInInbox: the inbox holds the message already (applied, or stored earlier): nothing
	// was changed, and nothing will apply it twice.
	AlreadyInInbox []string
}

// ErrNotRetryable marks a dead letter RetryDeadLetters cannot apply through the inbox: a record
// that could not be parsed (no message id, no event type), a payload a claim check never
// fetched, or a payload that is not JSON. Redrive its source's copy once its cause is fixed.
var ErrNotRetryable = errors.New("inbox: dead letter cannot be retried through the inbox")

// RetryDeadLetters stores the dead letters of consumer with the given keys in inbox_event, as
// the Async mode stores a message, so that the consumer's processor applies them once with its
// handlers; it runs in one transaction and changes nothing when a key is not a dead letter of
// consumer (ErrInvalidArgument) or cannot be retried (ErrNotRetryable).
//
// Exactly once by construction: the inbox key (consumer, message id) is taken by the stored row,
// so a copy of the message redriven from the DLQ (or delivered again) is a duplicate, and a dead
// letter the inbox already holds is left alone (AlreadyInInbox). A retried message is applied
// by the processor in arrival order among stored rows, not in its original place among its
// group's messages, which went on without it.
func RetryDeadLetters(ctx context.Context, db Beginner, consumer string, keys []string) (DeadLetterRetry, error) {
	if consumer == "" {
		return DeadLetterRetry{}, fmt.Errorf("%w: retry dead letters: consumer name is required", ErrInvalidArgument)
	}
	if len(keys) == 0 {
		return DeadLetterRetry{}, fmt.Errorf("retry dead letters: %w", ErrNothingSelected)
	}
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	storer, err := NewConsumer(db, ConsumerConfig{Consumer: consumer, Mode: Async})
	if err != nil {
		return DeadLetterRetry{}, err
	}
	var res DeadLetterRetry
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
SELECT record_key, coalesce(message_id, ''), event_type, aggregate_type, aggregate_id, coalesce(group_id, ''),
       created_at, headers, payload, error_class
FROM inbox_dead_letter
WHERE consumer = $1 AND record_key = ANY($2)
ORDER BY record_key
FOR UPDATE`, consumer, keys)
		if err != nil {
			return err
		}
		type found struct {
			key     string
			msg     Message
			payload *string
			class   string
		}
		letters, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (found, error) {
			var f found
			var created *time.Time
			err := r.Scan(&f.key, &f.msg.ID, &f.msg.EventType, &f.msg.AggregateType, &f.msg.AggregateID, &f.msg.GroupID,
				&created, &f.msg.Headers, &f.payload, &f.class)
			if created != nil {
				f.msg.CreatedAt = created.UTC()
			}
			if f.msg.ID == "" {
				f.msg.ID, f.msg.EventType = f.key, "" // not parsed: refused below, named by its key
			}
			return f, err
		})
		if err != nil {
			return err
		}
		if missing := missingKeys(keys, letters, func(f found) string { return f.key }); len(missing) > 0 {
			return fmt.Errorf("%w: %s: not dead letters of consumer %q; nothing retried", ErrInvalidArgument, strings.Join(missing, ", "), consumer)
		}
		var refused []error
		for _, f := range letters {
			switch {
			case f.msg.EventType == "":
				refused = append(refused, fmt.Errorf("%s: the record could not be parsed (no message id or event type)", f.msg.ID))
			case f.class == ClassClaimCheck:
				refused = append(refused, fmt.Errorf("%s: its payload was never fetched from S3 (redrive its DLQ copy once the object is readable)", f.msg.ID))
			case f.payload == nil || !json.Valid([]byte(*f.payload)):
				refused = append(refused, fmt.Errorf("%s: its payload is not JSON", f.msg.ID))
			}
		}
		if len(refused) > 0 {
			return fmt.Errorf("%w; nothing retried: %w", ErrNotRetryable, errors.Join(refused...))
		}
		for _, f := range letters {
			f.msg.Payload = json.RawMessage(*f.payload)
			if f.msg.Headers == nil {
				f.msg.Headers = map[string]string{}
			}
			out, err := storer.apply(ctx, tx, f.msg)
			if err != nil {
				return err
			}
			if out == Duplicate {
				res.AlreadyInInbox = append(res.AlreadyInInbox, f.msg.ID)
				continue
			}
			res.Stored = append(res.Stored, f.msg.ID)
		}
		if len(res.Stored) > 0 {
			_, err = tx.Exec(ctx, `UPDATE inbox_dead_letter SET retried_at = clock_timestamp() WHERE consumer = $1 AND record_key = ANY($2)`,
				consumer, res.Stored)
		}
		return err
	})
	if err != nil {
		return DeadLetterRetry{}, fmt.Errorf("retry dead letters: %w", err)
	}
	return res, nil
}

// missingKeys returns the keys (sorted) that no element of found has.
func missingKeys[T any](keys []string, found []T, key func(T) string) []string {
	have := make(map[string]bool, len(found))
	for _, f := range found {
		have[key(f)] = true
	}
	var out []string
	for _, k := range keys {
		if !have[k] {
			out = append(out, k)
		}
	}
	return out
}
