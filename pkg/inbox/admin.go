package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/pkg/partition"
)

// Querier runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Lag is the inbox backlog of one consumer, the figures its alarms watch (outbox.Lag is the
// outbox's).
type Lag struct {
	Consumer string `json:"consumer"`
	// Unprocessed counts stored rows not yet applied and not parked (the Async mode's backlog).
	Unprocessed int64 `json:"unprocessed"`
	// OldestUnprocessedAge is the age of the oldest such row (zero when there is none).
	OldestUnprocessedAge time.Duration `json:"oldest_unprocessed_age"`
	// Parked counts rows that exhausted their attempts and wait for an operator.
	Parked int64 `json:"parked"`
}

// LagOf returns the backlog of every consumer that has unprocessed or parked rows, sorted by
// consumer name. Consumers whose rows are all processed are not listed. It reads only the
// partial indexes, so its cost follows the backlog, not the table. outbox.LagOf is its
// counterpart.
func LagOf(ctx context.Context, db Querier) ([]Lag, error) {
	rows, err := db.Query(ctx, `
SELECT consumer,
       count(*) FILTER (WHERE parked_at IS NULL),
       coalesce(extract(epoch FROM now() - min(received_at) FILTER (WHERE parked_at IS NULL)), 0)::float8,
       count(*) FILTER (WHERE parked_at IS NOT NULL)
FROM inbox_event
WHERE processed_at IS NULL
GROUP BY consumer
ORDER BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("read inbox lag: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lag, error) {
		var s Lag
		var age float64
		err := r.Scan(&s.Consumer, &s.Unprocessed, &age, &s.Parked)
		s.OldestUnprocessedAge = time.Duration(age * float64(time.Second))
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read inbox lag: %w", err)
	}
	return out, nil
}

// ParkedEvent is a stored message the Processor gave up on.
type ParkedEvent struct {
	Consumer   string            `json:"consumer"`
	MessageID  string            `json:"message_id"`
	EventType  string            `json:"event_type"`
	GroupID    string            `json:"group_id,omitempty"`
	Headers    map[string]string `json:"headers"`
	Payload    []byte            `json:"payload"`
	Attempts   int               `json:"attempts"`
	LastError  string            `json:"last_error"`
	ReceivedAt time.Time         `json:"received_at"`
	ParkedAt   time.Time         `json:"parked_at"`
}

// ListParked returns up to limit parked rows of consumer (every consumer when it is ""),
// oldest parked first. A limit of 0 or less means 100.
func ListParked(ctx context.Context, db Querier, consumer string, limit int) ([]ParkedEvent, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, `
SELECT consumer, message_id, event_type, coalesce(group_id, ''), headers, coalesce(payload, 'null'::json)::text,
       attempts, coalesce(last_error, ''), received_at, parked_at
FROM inbox_event
WHERE parked_at IS NOT NULL AND processed_at IS NULL AND ($1 = '' OR consumer = $1)
ORDER BY parked_at, consumer, message_id
LIMIT $2`, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("list parked inbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedEvent, error) {
		var e ParkedEvent
		var payload string
		err := r.Scan(&e.Consumer, &e.MessageID, &e.EventType, &e.GroupID, &e.Headers, &payload,
			&e.Attempts, &e.LastError, &e.ReceivedAt, &e.ParkedAt)
		e.Payload = []byte(payload)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list parked inbox rows: %w", err)
	}
	return out, nil
}

// ErrNothingSelected is returned by RetryParked for an empty selection; it is the same error
// as outbox.RetryQuarantined's.
var ErrNothingSelected = admin.ErrNothingSelected

// RetryParked un-parks the parked rows of consumer among messageIDs so the Processor tries them
// again right away with a fresh attempt count, and returns how many it un-parked (ids that are
// not parked are ignored). An empty messageIDs, nil or not, changes nothing and returns
// ErrNothingSelected: to un-park every parked row of the consumer, call RetryAllParked. An
// empty consumer is refused with ErrInvalidArgument. outbox.RetryQuarantined is its
// counterpart.
func RetryParked(ctx context.Context, db Querier, consumer string, messageIDs []string) (int64, error) {
	if consumer == "" {
		return 0, fmt.Errorf("%w: retry parked inbox rows: consumer name is required", ErrInvalidArgument)
	}
	if len(messageIDs) == 0 {
		return 0, fmt.Errorf("retry parked inbox rows: %w (RetryAllParked un-parks every one)", ErrNothingSelected)
	}
	return retryParked(ctx, db, consumer, messageIDs)
}

// RetryAllParked un-parks every parked row of consumer, as RetryParked does the rows it is
// given, and returns how many. An empty consumer is refused with ErrInvalidArgument.
// outbox.RetryAllQuarantined is its counterpart.
func RetryAllParked(ctx context.Context, db Querier, consumer string) (int64, error) {
	if consumer == "" {
		return 0, fmt.Errorf("%w: retry parked inbox rows: consumer name is required", ErrInvalidArgument)
	}
	return retryParked(ctx, db, consumer, nil)
}

// retryParked un-parks the parked rows of consumer among messageIDs, every one when nil.
func retryParked(ctx context.Context, db Querier, consumer string, messageIDs []string) (int64, error) {
	tag, err := db.Exec(ctx, `
UPDATE inbox_event
SET parked_at = NULL, attempts = 0, next_attempt_at = NULL
WHERE consumer = $1 AND parked_at IS NOT NULL AND processed_at IS NULL
  AND ($2::text[] IS NULL OR message_id = ANY($2::text[]))`, consumer, messageIDs)
	if err != nil {
		return 0, fmt.Errorf("retry parked inbox rows: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PurgeOptions tunes Purge. A nil *PurgeOptions means the defaults.
type PurgeOptions struct {
	// Consumer limits the purge to one consumer. Defaults to "" (every consumer).
	Consumer string
	// BatchSize is the most rows one DELETE statement removes, keeping locks and WAL bursts
	// small. Defaults to DefaultPurgeBatchSize; a negative value is refused with
	// ErrInvalidBatchSize (and ErrInvalidArgument).
	BatchSize int
	// Progress, when set, is called after each DELETE statement with the rows deleted so far.
	// The context is checked right after it returns, so a caller that cancels the context from
	// Progress stops the purge at that batch boundary, no statement cut short. Row by row
	// purges only (a partitioned inbox_event drops whole partitions). Defaults to nil.
	Progress func(deleted int64)
}

// DefaultPurgeBatchSize is PurgeOptions.BatchSize's default, the same in inbox and outbox
// (outbox.DefaultPurgeBatchSize).
const DefaultPurgeBatchSize = admin.DefaultPurgeBatchSize

// ErrInvalidBatchSize is returned, wrapped, for a negative PurgeOptions.BatchSize; it is the
// same error as outbox.Purge's.
var ErrInvalidBatchSize = admin.ErrInvalidBatchSize

// Purge deletes processed inbox rows whose processed_at is older than olderThan, and dead
// letters (inbox_dead_letter) whose last failure is older than olderThan, in batches (each its
// own statement, so each commits on its own when db is a pool), and returns how many rows of
// both it deleted. Unprocessed and parked rows are never deleted.
//
// On a partitioned inbox_event (see pkg/partition), purging every consumer drops whole
// partitions instead, as partition.Maintain with Retention olderThan does (db must then be a
// *pgxpool.Pool or a *pgx.Conn), deletes expired rows of the default partition in batches, and
// counts a dropped partition's rows from PostgreSQL's estimate (pg_class.reltuples). A
// partition is dropped only once every row in it was processed before the cutoff. Purging one
// consumer (opts.Consumer) deletes its rows in batches, as on a plain table.
//
// A purged message is no longer recognised as a duplicate: keep olderThan well above the
// longest a message can still arrive, its source's retention plus any DLQ redrive or replay
// window (SQS keeps messages at most 14 days; a Kinesis stream or Kafka topic keeps its
// records as long as its retention is set to).
func Purge(ctx context.Context, db Querier, olderThan time.Duration, opts *PurgeOptions) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("%w: purge inbox: olderThan must be positive, got %s", ErrInvalidArgument, olderThan)
	}
	var o PurgeOptions
	if opts != nil {
		o = *opts
	}
	var err error
	if o.BatchSize, err = admin.PurgeBatch(o.BatchSize); err != nil {
		return 0, fmt.Errorf("%w: purge inbox: %w", ErrInvalidArgument, err)
	}
	letters, err := admin.PurgeDeadLetters(ctx, db, olderThan, o.Consumer, o.BatchSize)
	if err != nil {
		return letters, fmt.Errorf("purge inbox: %w", err)
	}
	var rows int64
	if o.Consumer == "" {
		layout, err := partition.Read(ctx, db, partition.Inbox)
		if err != nil {
			return letters, fmt.Errorf("purge inbox: %w", err)
		}
		if layout.Partitioned {
			rows, err = partition.Purge(ctx, db, partition.Inbox, olderThan, o.BatchSize)
			return letters + rows, err
		}
	}
	rows, err = admin.PurgeInboxRows(ctx, db, "inbox_event", olderThan, o.Consumer, o.BatchSize, o.Progress)
	return letters + rows, err
}
