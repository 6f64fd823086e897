package partition

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/admin"
)

// A partitioned outbox_event is RANGE-partitioned on id: retention drops whole partitions
// instead of deleting rows, so it costs a catalog change a day instead of a DELETE of every
// row and the index bloat that follows.
//
// Why ranges of id: the primary key stays (id), as the contract fixes it, and the relay, which
// addresses rows by id and partition_key only, runs unchanged. Each partition is sized from the
// observed rate of new ids to fill in about one Interval. PostgreSQL cannot enforce a unique
// index across partitions unless it holds the partition key, so event_id is not unique in the
// database any more: its uniqueness comes from how it is made (a UUIDv7 from Write,
// gen_random_uuid() in plain SQL), and consumers deduplicate on it as before.

// outboxSpec describes outbox_event.
var outboxSpec = tableSpec{
	Table:      "outbox_event",
	Kind:       identityKey,
	Column:     "id",
	TimeColumn: "created_at",
	Finished:   "published",
	// outbox_event_pending_key_idx holds exactly the unpublished rows.
	Unfinished: "SELECT EXISTS (SELECT 1 FROM %[1]s WHERE published_at IS NULL)",
	// outbox_event_published_brin: block ranges whose rows were all published before the cutoff
	// are skipped from the index's summaries.
	Young:      "SELECT EXISTS (SELECT 1 FROM %[1]s WHERE published_at >= $1)",
	FillFactor: 80,
	LocalOnly: map[string]string{
		"outbox_event_event_id_key": "PostgreSQL cannot enforce event_id's uniqueness across partitions; it stays unique among the rows " +
			"written before the conversion, and later rows rely on how event_id is made (UUIDv7, gen_random_uuid())",
	},
	ExtraIndexes: []extraIndex{{Name: "outbox_event_published_brin", Using: "USING brin (published_at)"}},
	PurgeBatch:   admin.DefaultPurgeBatchSize,
	PurgeRows: func(ctx context.Context, q Querier, table string, retention time.Duration, batch int) (int64, error) {
		var cutoff time.Time
		if err := q.QueryRow(ctx, "SELECT now() - $1 * interval '1 millisecond'", retention.Milliseconds()).Scan(&cutoff); err != nil {
			return 0, fmt.Errorf("read the clock: %w", err)
		}
		return admin.PurgeOutboxRows(ctx, q, table, cutoff, batch, nil)
	},
}

// A partitioned inbox_event is RANGE-partitioned on received_at, one partition per Interval:
// retention drops whole partitions instead of deleting rows.
//
// The dedup key (consumer, message_id) no longer includes the partition key, so PostgreSQL
// cannot enforce it across partitions and ON CONFLICT would not see a duplicate stored in
// another partition. On a partitioned inbox the Consumer therefore takes a transaction-scoped
// advisory lock on each message's key and looks the key up in every partition before inserting
// (pkg/inbox/partition_insert.go). Each partition keeps a unique index on (consumer,
// message_id), which also serves that lookup.

// inboxSpec describes inbox_event.
var inboxSpec = tableSpec{
	Table:    "inbox_event",
	Kind:     timeKey,
	Column:   "received_at",
	Finished: "processed",
	// An unprocessed row is in one of the three partial indexes: FIFO rows in
	// inbox_event_unprocessed_group_idx, other unparked ones in inbox_event_ready_idx, parked
	// ones in inbox_event_parked_idx.
	Unfinished: `SELECT EXISTS (SELECT 1 FROM %[1]s WHERE processed_at IS NULL AND group_id IS NOT NULL)
		OR EXISTS (SELECT 1 FROM %[1]s WHERE processed_at IS NULL AND parked_at IS NULL AND group_id IS NULL)
		OR EXISTS (SELECT 1 FROM %[1]s WHERE parked_at IS NOT NULL AND processed_at IS NULL)`,
	// inbox_event_processed_idx.
	Young:       "SELECT EXISTS (SELECT 1 FROM %[1]s WHERE processed_at >= $1)",
	LocalUnique: []string{"consumer", "message_id"},
	LocalOnly: map[string]string{
		"inbox_event_pkey": "the dedup key (consumer, message_id) is enforced across partitions by the consumers " +
			"(an advisory lock per key, then a lookup in every partition); each partition keeps a unique index on it",
	},
	// Smaller than the outbox's: each statement locks its rows (FOR UPDATE SKIP LOCKED) while
	// consumers write beside it.
	PurgeBatch: 1000,
	PurgeRows: func(ctx context.Context, q Querier, table string, retention time.Duration, batch int) (int64, error) {
		return admin.PurgeInboxRows(ctx, q, table, retention, "", batch, nil)
	},
}

// Purge is retention alone on partitioned table t, what outbox.Purge and inbox.Purge do on a
// partitioned table: it drops the partitions whose rows all finished (were published, were
// processed) before now - olderThan and deletes such rows from the default partition,
// batchSize rows per statement (0: the table's default), creating no partition. It returns
// the rows removed, a dropped partition's counted from PostgreSQL's estimate
// (pg_class.reltuples). db must be able to begin transactions: a *pgxpool.Pool or a *pgx.Conn.
func Purge(ctx context.Context, db Querier, t *Table, olderThan time.Duration, batchSize int) (int64, error) {
	spec := t.spec
	d, ok := db.(DB)
	if !ok {
		return 0, fmt.Errorf("purge %s: the table is partitioned: pass a *pgxpool.Pool or *pgx.Conn, which can drop partitions", spec.Table)
	}
	if olderThan <= 0 {
		return 0, fmt.Errorf("purge %s: olderThan must be positive, got %s", spec.Table, olderThan)
	}
	rep, err := maintainSpec(ctx, d, spec, Options{Retention: olderThan}.withDefaults(), false, batchSize)
	n := rep.Purged
	for _, p := range rep.Dropped {
		n += max(p.Rows, 0)
	}
	if err != nil {
		return n, fmt.Errorf("purge %s: %w", spec.Table, err)
	}
	return n, nil
}
