package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// How a Consumer deduplicates on a partitioned inbox_event (see pkg/partition).
//
// On a plain table the primary key (consumer, message_id) finds a duplicate: INSERT ... ON
// CONFLICT DO NOTHING. A partitioned table has no index across partitions on that key (it lacks
// the partition key), so ON CONFLICT is impossible there and a plain INSERT would store, and
// apply, a message a second time whenever its first row sits in another partition. Instead, in
// the transaction of the effects:
//
//  1. lockMessagesSQL takes a transaction-scoped advisory lock on each message's key (a 64-bit
//     hash of consumer and message id), a batch's keys in hash order: two transactions holding
//     the same message serialize on it, and transactions holding several never wait for each
//     other in a cycle. The lock is released at COMMIT or ROLLBACK.
//  2. The insert statement that follows, in the same round trip, stores each message that no
//     partition holds yet: one lookup of the key per partition (the partitions' unique index on
//     (consumer, message_id)). It is a later statement, so in READ COMMITTED its snapshot
//     includes what the previous holder of the lock committed: a concurrent delivery that
//     waited for the lock finds the row and is a duplicate.
//
// Step 2 needs a snapshot taken after step 1, which REPEATABLE READ and SERIALIZABLE
// transactions do not take: the consumer refuses them (the record fails, nothing commits).
//
// The Consumer learns how inbox_event is stored from the catalog once, and again when the
// plain insert fails because the table has no unique key any more (it was converted while the
// Consumer ran): that record fails and comes back, the next ones use this path.

// Layouts of inbox_event, as a Consumer last saw it.
const (
	layoutUnknown int32 = iota
	layoutPlain
	layoutPartitioned
)

// layoutSQL reports whether inbox_event (resolved like every other statement) is partitioned.
const layoutSQL = `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass('inbox_event')), false)`

// lockMessagesSQL locks the keys of consumer $1 and message ids $2, in hash order, and returns
// the transaction's isolation level and how many keys it locked.
const lockMessagesSQL = `
SELECT current_setting('transaction_isolation'), count(l.locked)
FROM (SELECT pg_advisory_xact_lock(k.h)::text AS locked
      FROM (SELECT DISTINCT hashtextextended(length($1::text) || ':' || $1::text || m, 7243) AS h
            FROM unnest($2::text[]) AS m ORDER BY 1) k) l`

// insertSyncPartitioned and insertAsyncPartitioned store one message unless a partition holds
// it (insertSync and insertAsync on a partitioned table).
const insertSyncPartitioned = `
INSERT INTO inbox_event (consumer, message_id, event_type, aggregate_type, aggregate_id, group_id,
                         created_at, headers, payload, processed_at)
SELECT $1, $2, $3, $4, $5, NULLIF($6, ''), $7, $8, $9, clock_timestamp()
WHERE NOT EXISTS (SELECT 1 FROM inbox_event e WHERE e.consumer = $1 AND e.message_id = $2)`

const insertAsyncPartitioned = `
INSERT INTO inbox_event (consumer, message_id, event_type, aggregate_type, aggregate_id, group_id,
                         created_at, headers, payload)
SELECT $1, $2, $3, $4, $5, NULLIF($6, ''), $7, $8, $9
WHERE NOT EXISTS (SELECT 1 FROM inbox_event e WHERE e.consumer = $1 AND e.message_id = $2)`

// insertBatchPartitioned is insertBatch on a partitioned table: each message is looked up with a
// LATERAL ... LIMIT 1 (a nested loop of index lookups whatever the statistics say) and stored
// when no partition holds it.
const insertBatchPartitioned = `
INSERT INTO inbox_event (consumer, message_id, event_type, aggregate_type, aggregate_id, group_id,
                         created_at, headers, payload, processed_at)
SELECT $1::text, m.message_id, m.event_type, m.aggregate_type, m.aggregate_id, NULLIF(m.group_id, ''),
       m.created_at, m.headers::jsonb, m.payload::json, clock_timestamp()
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::text[], $9::text[])
     AS m (message_id, event_type, aggregate_type, aggregate_id, group_id, created_at, headers, payload)
LEFT JOIN LATERAL (SELECT true AS found FROM inbox_event e WHERE e.consumer = $1::text AND e.message_id = m.message_id LIMIT 1) d ON true
WHERE d.found IS NULL
RETURNING message_id`

// partitioned reports whether inbox_event is partitioned, reading the catalog in tx the first
// time.
func (c *Consumer) partitioned(ctx context.Context, tx pgx.Tx) (bool, error) {
	switch c.layout.Load() {
	case layoutPlain:
		return false, nil
	case layoutPartitioned:
		return true, nil
	}
	var p bool
	if err := tx.QueryRow(ctx, layoutSQL).Scan(&p); err != nil {
		return false, fmt.Errorf("read how inbox_event is stored: %w", err)
	}
	if p {
		c.layout.Store(layoutPartitioned)
	} else {
		c.layout.Store(layoutPlain)
	}
	return p, nil
}

// relearnLayout makes the Consumer read the catalog again when err says that ON CONFLICT found
// no unique key on (consumer, message_id): inbox_event was converted to a partitioned table.
func (c *Consumer) relearnLayout(err error) {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42P10" {
		c.layout.Store(layoutUnknown)
	}
}

// queueLock adds lockMessagesSQL for ids to b; the callback checks the isolation level.
func (c *Consumer) queueLock(b *pgx.Batch, ids []string) {
	b.Queue(lockMessagesSQL, c.cfg.Consumer, ids).QueryRow(func(row pgx.Row) error {
		var (
			iso    string
			locked int64
		)
		if err := row.Scan(&iso, &locked); err != nil {
			return fmt.Errorf("lock the inbox keys: %w", err)
		}
		if iso != "read committed" {
			return fmt.Errorf("%w: a partitioned inbox_event needs READ COMMITTED transactions to see a concurrent delivery's row, "+
				"this one is %s (check default_transaction_isolation)", ErrInvalidConfig, iso)
		}
		return nil
	})
}

// insertPartitioned stores one message on a partitioned inbox_event unless a partition holds
// it, after locking its key, in one round trip. sql is insertSyncPartitioned or
// insertAsyncPartitioned; args are insertSync's.
func (c *Consumer) insertPartitioned(ctx context.Context, tx pgx.Tx, id, sql string, args ...any) (pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	c.queueLock(b, []string{id})
	var tag pgconn.CommandTag
	b.Queue(sql, args...).Exec(func(ct pgconn.CommandTag) error {
		tag = ct
		return nil
	})
	err := tx.SendBatch(ctx, b).Close()
	return tag, err
}

// insertBatchRows runs insertBatchPartitioned after locking ids, in one round trip, and returns
// the ids it stored.
func (c *Consumer) insertBatchRows(ctx context.Context, tx pgx.Tx, ids []string, args ...any) ([]string, error) {
	b := &pgx.Batch{}
	c.queueLock(b, ids)
	var inserted []string
	b.Queue(insertBatchPartitioned, args...).Query(func(rows pgx.Rows) error {
		var err error
		inserted, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return inserted, nil
}
