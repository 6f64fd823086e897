package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs single statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PurgeOutboxRows deletes the rows of table (outbox_event, or the default partition of a
// partitioned one) published before cutoff, batch rows examined per statement, calling
// progress (when set) after each statement with the rows deleted so far.
func PurgeOutboxRows(ctx context.Context, db Querier, table string, cutoff time.Time, batch int, progress func(int64)) (int64, error) {
	var (
		total  int64
		cursor int64
	)
	for {
		// Walk the primary key from the oldest row: rows are created in roughly id order, so once
		// a batch reaches rows created after the cutoff nothing further can be old enough.
		var (
			last    *int64
			deleted int64
			young   bool
		)
		err := db.QueryRow(ctx, `
			WITH batch AS (
			    SELECT id, created_at, published_at FROM `+table+` WHERE id > $1 ORDER BY id LIMIT $2
			), del AS (
			    -- The test is on o, the row as it is when the DELETE reaches it, not on the batch's
			    -- snapshot: a row that Replay made unpublished meanwhile is rechecked and kept.
			    -- o.id > $1 starts the join's index scan at the cursor, not across the index
			    -- entries of the rows earlier batches deleted.
			    DELETE FROM `+table+` o USING batch b
			    WHERE o.id = b.id AND o.id > $1 AND b.published_at IS NOT NULL AND o.published_at IS NOT NULL AND o.published_at < $3
			    RETURNING o.id
			)
			SELECT max(b.id), (SELECT count(*) FROM del), coalesce(bool_or(b.created_at >= $3), false) FROM batch b`,
			cursor, batch, cutoff).Scan(&last, &deleted, &young)
		if err != nil {
			return total, fmt.Errorf("purge outbox after id %d: %w", cursor, err)
		}
		total += deleted
		if progress != nil {
			progress(total)
		}
		if last == nil || young {
			return total, nil
		}
		cursor = *last
		if ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}

// PurgeInboxRows deletes the rows of table (inbox_event, or the default partition of a
// partitioned one) processed longer than olderThan ago, of consumer ("" for all), batch rows per
// statement, calling progress (when set) after each statement with the rows deleted so far.
func PurgeInboxRows(ctx context.Context, db Querier, table string, olderThan time.Duration, consumer string, batch int, progress func(int64)) (int64, error) {
	return deleteInBatches(ctx, db, "purge inbox", `
DELETE FROM `+table+`
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM `+table+`
    WHERE processed_at IS NOT NULL
      AND processed_at < now() - make_interval(secs => $1::float8)
      AND ($2 = '' OR consumer = $2)
    ORDER BY processed_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)`, batch, progress, olderThan.Seconds(), consumer, batch)
}

// PurgeDeadLetters deletes the consumers' dead letters (inbox_dead_letter) of consumer ("" for
// all) whose last failure is older than olderThan, batch rows per statement.
func PurgeDeadLetters(ctx context.Context, db Querier, olderThan time.Duration, consumer string, batch int) (int64, error) {
	return deleteInBatches(ctx, db, "purge dead letters", `
DELETE FROM inbox_dead_letter
WHERE (consumer, record_key) IN (
    SELECT consumer, record_key FROM inbox_dead_letter
    WHERE last_failed_at < now() - make_interval(secs => $1::float8) AND ($2 = '' OR consumer = $2)
    ORDER BY last_failed_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)`, batch, nil, olderThan.Seconds(), consumer, batch)
}

// deleteInBatches runs stmt, a DELETE of at most batch rows, until one deletes fewer (or ctx
// ends between two), calling progress (when set) after each with the rows deleted so far.
func deleteInBatches(ctx context.Context, db Querier, what, stmt string, batch int, progress func(int64), args ...any) (int64, error) {
	var total int64
	for {
		tag, err := db.Exec(ctx, stmt, args...)
		if err != nil {
			return total, fmt.Errorf("%s: %w", what, err)
		}
		total += tag.RowsAffected()
		if progress != nil {
			progress(total)
		}
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		if ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
