package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/pkg/partition"
)

// Querier is what the operational functions need: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Lag is the outbox's backlog, the figures its alarms watch.
type Lag struct {
	// Pending counts unpublished rows that are not quarantined.
	Pending int64
	// OldestPendingAge is the age of the oldest pending row (0 when none).
	OldestPendingAge time.Duration
	// Quarantined counts rows that need an operator.
	Quarantined int64
	// PublishedLastMinute counts rows published in the last minute, among the newest 100,000 rows.
	PublishedLastMinute int64
}

// LagOf reads the backlog figures. Its cost follows the backlog, not the table: it reads only
// the partial index of unpublished rows and the newest rows. inbox.LagOf is its counterpart.
func LagOf(ctx context.Context, db Querier) (Lag, error) {
	var (
		lag    Lag
		oldest *time.Time
		now    time.Time
	)
	err := db.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE quarantined_at IS NULL),
		       count(*) FILTER (WHERE quarantined_at IS NOT NULL),
		       min(created_at) FILTER (WHERE quarantined_at IS NULL),
		       now(),
		       (SELECT count(*) FROM (SELECT published_at FROM outbox_event ORDER BY id DESC LIMIT 100000) recent
		         WHERE published_at > now() - interval '1 minute')
		FROM outbox_event WHERE published_at IS NULL`).Scan(&lag.Pending, &lag.Quarantined, &oldest, &now, &lag.PublishedLastMinute)
	if err != nil {
		return Lag{}, fmt.Errorf("read outbox lag: %w", err)
	}
	if oldest != nil {
		lag.OldestPendingAge = max(now.Sub(*oldest), 0)
	}
	return lag, nil
}

// DefaultPurgeBatchSize is PurgeOptions.BatchSize's default, the same in outbox and inbox
// (inbox.DefaultPurgeBatchSize).
const DefaultPurgeBatchSize = admin.DefaultPurgeBatchSize

// PurgeOptions tune Purge. A nil *PurgeOptions takes the defaults.
type PurgeOptions struct {
	// BatchSize is the most rows one DELETE statement removes (each statement examines as many
	// rows in primary-key order). Defaults to DefaultPurgeBatchSize; a negative value is refused
	// with an error.
	BatchSize int
	// Progress, when set, is called after each DELETE statement with the rows deleted so far.
	// The context is checked right after it returns, so a caller that cancels the context from
	// Progress stops the purge at that batch boundary, no statement cut short. Plain tables
	// only (a partitioned outbox_event drops whole partitions). Defaults to nil.
	Progress func(deleted int64)
}

// Purge deletes published rows whose published_at is older than olderThan, in bounded batches
// (short statements, no long lock), and returns how many it deleted. Unpublished and
// quarantined rows are never deleted.
//
// On a partitioned outbox_event (see pkg/partition) it drops whole partitions instead, as
// partition.Maintain with Retention olderThan does (db must then be a *pgxpool.Pool or a
// *pgx.Conn), deletes expired rows of the default partition in batches, and counts a dropped
// partition's rows from PostgreSQL's estimate (pg_class.reltuples). A partition is dropped
// only once every row in it was published before the cutoff.
func Purge(ctx context.Context, db Querier, olderThan time.Duration, opts *PurgeOptions) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("outbox: purge needs a positive retention, got %s", olderThan)
	}
	var o PurgeOptions
	if opts != nil {
		o = *opts
	}
	batch, err := admin.PurgeBatch(o.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", err)
	}
	layout, err := partition.Read(ctx, db, partition.Outbox)
	if err != nil {
		return 0, fmt.Errorf("purge outbox: %w", err)
	}
	if layout.Partitioned {
		return partition.Purge(ctx, db, partition.Outbox, olderThan, batch)
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, "SELECT now() - $1 * interval '1 millisecond'", olderThan.Milliseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("purge outbox: %w", err)
	}
	return admin.PurgeOutboxRows(ctx, db, "outbox_event", cutoff, batch, o.Progress)
}

// QuarantinedRow is a row that could not be published, for an operator to inspect.
type QuarantinedRow struct {
	ID            int64
	EventID       uuid.UUID
	Topic         string
	EventType     string
	PartitionKey  string
	Attempts      int
	LastError     string
	CreatedAt     time.Time
	QuarantinedAt time.Time
	// BlockedBehind counts later unpublished rows of the same partition key waiting for this one.
	BlockedBehind int64
}

// ListQuarantined returns up to limit quarantined rows, oldest first.
func ListQuarantined(ctx context.Context, db Querier, limit int) ([]QuarantinedRow, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, `
		SELECT q.id, q.event_id, q.topic, q.event_type, q.partition_key, q.attempts, coalesce(q.last_error, ''),
		       q.created_at, q.quarantined_at,
		       (SELECT count(*) FROM outbox_event o WHERE o.partition_key = q.partition_key
		          AND o.published_at IS NULL AND o.id > q.id)
		FROM outbox_event q
		WHERE q.quarantined_at IS NOT NULL AND q.published_at IS NULL
		ORDER BY q.id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list quarantined outbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (QuarantinedRow, error) {
		var q QuarantinedRow
		err := row.Scan(&q.ID, &q.EventID, &q.Topic, &q.EventType, &q.PartitionKey, &q.Attempts, &q.LastError,
			&q.CreatedAt, &q.QuarantinedAt, &q.BlockedBehind)
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("list quarantined outbox rows: %w", err)
	}
	return out, nil
}

// RetryQuarantined releases the quarantined rows among ids for the relay to publish again with a
// fresh attempt count, and returns how many it released (ids that are not quarantined are
// ignored). An empty ids, nil or not, changes nothing and returns an error: to
// release every quarantined row, call RetryAllQuarantined. The last error is kept for the
// record until the row is published. inbox.RetryParked is its counterpart.
func RetryQuarantined(ctx context.Context, db Querier, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, fmt.Errorf("retry quarantined outbox rows: %w (RetryAllQuarantined releases every one)", admin.ErrNothingSelected)
	}
	return retryQuarantined(ctx, db, ids)
}

// RetryAllQuarantined releases every quarantined row, as RetryQuarantined does the rows it is
// given, and returns how many. inbox.RetryAllParked is its counterpart.
func RetryAllQuarantined(ctx context.Context, db Querier) (int64, error) {
	return retryQuarantined(ctx, db, nil)
}

// retryQuarantined releases the quarantined rows of ids, every one when ids is nil.
func retryQuarantined(ctx context.Context, db Querier, ids []int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `
		WITH released AS (
		    UPDATE outbox_event SET quarantined_at = NULL, attempts = 0, available_at = NULL, failing_since = NULL
		    WHERE quarantined_at IS NOT NULL AND published_at IS NULL
		      AND ($1::bigint[] IS NULL OR id = ANY($1))
		    RETURNING 1
		)
		`+bumpEpoch+`
		SELECT count(*) FROM released`, ids).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("retry quarantined outbox rows: %w", err)
	}
	return n, nil
}

// ReplayFilter selects published rows to publish again. Since is required.
type ReplayFilter struct {
	// Since and Until bound created_at (Until defaults to now; both inclusive of Since, exclusive of Until).
	Since, Until time.Time
	// Topic, AggregateType and AggregateID narrow the selection when set.
	Topic, AggregateType, AggregateID string
}

func (f ReplayFilter) args() ([]any, error) {
	if f.Since.IsZero() {
		return nil, errors.New("outbox: replay needs a start time (Since)")
	}
	until := f.Until
	if until.IsZero() {
		until = time.Now().Add(time.Hour)
	}
	if !until.After(f.Since) {
		return nil, fmt.Errorf("outbox: replay range is empty: until (%s) is not after since (%s)", until.Format(time.RFC3339), f.Since.Format(time.RFC3339))
	}
	return []any{f.Since, until, f.Topic, f.AggregateType, f.AggregateID}, nil
}

const replayWhere = `published_at IS NOT NULL AND created_at >= $1 AND created_at < $2
	AND ($3 = '' OR topic = $3) AND ($4 = '' OR aggregate_type = $4) AND ($5 = '' OR aggregate_id = $5)`

// CountReplay returns how many rows Replay with f would publish again.
func CountReplay(ctx context.Context, db Querier, f ReplayFilter) (int64, error) {
	args, err := f.args()
	if err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, "SELECT count(*) FROM outbox_event WHERE "+replayWhere, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count replay rows: %w", err)
	}
	return n, nil
}

// ReplayPlan is what a replay would mark: how many published rows match, and the range of
// their ids.
type ReplayPlan struct {
	// Rows is the number of published rows the filter matches.
	Rows int64
	// FirstID and LastID are the lowest and highest id among them (0 when none).
	FirstID, LastID int64
}

// PlanReplay counts the rows Replay with f would publish again, and the range of their ids;
// ReplayBatches given that range marks no row created since.
func PlanReplay(ctx context.Context, db Querier, f ReplayFilter) (ReplayPlan, error) {
	args, err := f.args()
	if err != nil {
		return ReplayPlan{}, err
	}
	var p ReplayPlan
	if err := db.QueryRow(ctx, "SELECT count(*), coalesce(min(id), 0), coalesce(max(id), 0) FROM outbox_event WHERE "+replayWhere,
		args...).Scan(&p.Rows, &p.FirstID, &p.LastID); err != nil {
		return ReplayPlan{}, fmt.Errorf("plan replay: %w", err)
	}
	return p, nil
}

// ReplayOptions configure ReplayBatches. The zero value walks every id in batches of
// DefaultPurgeBatchSize.
type ReplayOptions struct {
	// After and Through bound the ids walked: After < id <= Through (Through 0: no upper
	// bound). A ReplayPlan's FirstID-1 and LastID keep rows created after the plan out.
	After, Through int64
	// BatchSize is the most rows one UPDATE examines. Defaults to DefaultPurgeBatchSize.
	BatchSize int
	// Progress, when set, is called after each batch with the rows marked so far and the
	// highest id the walk reached.
	Progress func(marked, lastID int64)
}

// Replay marks the selected published rows unpublished, so the relay publishes them again with
// the same event_id: existing consumers deduplicate them, a new or rebuilt consumer applies them.
// Each partition key's rows go out again in id order. It runs as ReplayBatches with the
// default options, and returns how many rows it marked.
func Replay(ctx context.Context, db Querier, f ReplayFilter) (int64, error) {
	return ReplayBatches(ctx, db, f, nil)
}

// ReplayBatches is Replay in bounded statements, like Purge: it walks the ids in ascending
// order, BatchSize at a time, and marks the matching published rows of each batch in one
// statement (its own transaction, unless db is one), so no statement holds its locks or
// writes its WAL for long, and an interruption leaves whole batches marked. A key's rows are
// marked in id order, so the relay publishes them again in that order. It returns exactly the
// number of rows it marked; it stops between batches once ctx ends.
func ReplayBatches(ctx context.Context, db Querier, f ReplayFilter, opts *ReplayOptions) (int64, error) {
	args, err := f.args()
	if err != nil {
		return 0, err
	}
	var o ReplayOptions
	if opts != nil {
		o = *opts
	}
	batch, err := admin.PurgeBatch(o.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("outbox: replay: %w", err)
	}
	var total int64
	for cursor := o.After; ; {
		var (
			last   *int64
			marked int64
		)
		// The filter is tested on o, the row as the UPDATE reaches it: a row the relay has not
		// published (again) is left alone. o.id > $6 starts the join's index scan at the cursor.
		err := db.QueryRow(ctx, `
			WITH batch AS (
			    SELECT id FROM outbox_event WHERE id > $6 AND ($7 = 0 OR id <= $7) ORDER BY id LIMIT $8
			), replayed AS (
			    UPDATE outbox_event o SET published_at = NULL, available_at = NULL, attempts = 0, last_error = NULL, failing_since = NULL
			    FROM batch b
			    WHERE o.id = b.id AND o.id > $6 AND `+replayWhere+`
			    RETURNING 1
			)
			`+bumpEpoch+`
			SELECT max(b.id), (SELECT count(*) FROM replayed) FROM batch b`,
			append(args, cursor, o.Through, batch)...).Scan(&last, &marked)
		if err != nil {
			return total, fmt.Errorf("replay outbox rows after id %d: %w", cursor, err)
		}
		total += marked
		if last == nil {
			return total, nil
		}
		cursor = *last
		if o.Progress != nil {
			o.Progress(total, cursor)
		}
		if o.Through != 0 && cursor >= o.Through {
			return total, nil
		}
		if ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}

// bumpEpoch is a CTE that moves outbox_control.admin_epoch in the same statement as an
// operator's change, so that relays notice on their next poll that rows became pending without
// new ids, and read every key from its first pending row again. It also writes a logical
// decoding message (walEpochPrefix) with the transaction, which relays following the WAL
// (walFollower) receive when it commits instead of polling for the epoch; any role may write
// one, and on a server without wal_level=logical it is a WAL record no one reads.
const bumpEpoch = `, epoch AS (UPDATE outbox_control SET admin_epoch = admin_epoch + 1
	RETURNING pg_logical_emit_message(true, '` + walEpochPrefix + `', ''))`

// Horizon is what holds back VACUUM: the transactions and replication slots that keep dead
// rows alive. While it lasts, the index entries of published rows stay in
// outbox_event_pending_key_idx and every reader steps over them, and the table and its indexes
// grow. Alarm on OldestTransactionAge.
type Horizon struct {
	// OldestTransactionAge is the age of the oldest transaction holding it back: a session's
	// open transaction that holds a snapshot or has written (since it began), or a prepared
	// transaction (since PREPARE TRANSACTION). 0 when none.
	OldestTransactionAge time.Duration
	// HeldBy names that transaction: "session 4242 (psql, idle in transaction)" or
	// "prepared transaction nightly-17 (owner billing)". Empty when none.
	HeldBy string
	// XIDAge is how many transactions old the horizon is: age() of the oldest transaction id
	// or snapshot xmin held by a transaction, a replication slot's xmin or a standby's feedback
	// (0 when nothing holds one, or when no transaction id was assigned since). VACUUM of
	// outbox_event can remove no row version deleted by a later transaction.
	XIDAge int64
	// Replication names a replication slot (or a standby's feedback through a walsender without
	// a slot) that holds the horizon further back than every transaction, with its age in
	// transactions: these record no start time, so they have no OldestTransactionAge. A
	// logical slot's catalog_xmin holds back only the system catalogs' VACUUM, and says so.
	// Empty when no slot holds the horizon further back.
	Replication string
}

// horizonHolder is one row of HorizonOf's query.
type horizonHolder struct {
	timed bool // a transaction with a start time (a session or a prepared transaction)
	// catalogOnly: a logical slot's catalog_xmin, which holds back only the system catalogs.
	catalogOnly bool
	name        string
	age         *time.Duration
	xidAge      *int64
}

// HorizonOf reads what holds back VACUUM in this database: the oldest open or prepared
// transaction other than the caller's own session's, and any replication slot that holds the
// horizon further back. A session counts when its transaction holds a snapshot
// (pg_stat_activity.backend_xmin: REPEATABLE READ, or a statement running) or has written
// (backend_xid: a READ COMMITTED transaction that wrote a row and sits idle in transaction,
// the commonest case). Transactions in other databases of the server do not hold back this
// one's VACUUM and are left out; replication slots and standbys' feedback hold back every
// database's.
//
// Where migration 0006 created the function sluice_horizon() and the caller may execute it (the
// migrations custom resource grants it to the relay's role), HorizonOf reads through it: it
// returns these rows and no query text, with its owner's rights, so the relay's role needs no
// pg_read_all_stats (which would show it every session's query with its literals). Otherwise
// it reads the views itself, and sees other roles' sessions only with pg_read_all_stats.
func HorizonOf(ctx context.Context, db Querier) (Horizon, error) {
	var viaFunction bool
	if err := db.QueryRow(ctx, `SELECT coalesce(has_function_privilege(to_regprocedure('sluice_horizon()'), 'EXECUTE'), false)`).Scan(&viaFunction); err != nil {
		return Horizon{}, fmt.Errorf("read the oldest transaction: %w", err)
	}
	query := horizonQuery
	if viaFunction {
		query = `SELECT timed, catalog_only, holder, age, xid_age FROM sluice_horizon()`
	}
	rows, err := db.Query(ctx, query)
	if err != nil {
		return Horizon{}, fmt.Errorf("read the oldest transaction: %w", err)
	}
	holders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (horizonHolder, error) {
		var h horizonHolder
		err := row.Scan(&h.timed, &h.catalogOnly, &h.name, &h.age, &h.xidAge)
		return h, err
	})
	if err != nil {
		return Horizon{}, fmt.Errorf("read the oldest transaction: %w", err)
	}
	return horizonFrom(holders), nil
}

// horizonQuery is HorizonOf's query where the function sluice_horizon() (the same query run with
// its owner's rights, migrations/0006_relay_horizon.up.sql) is missing or not granted.
const horizonQuery = `
		SELECT true, false,
		       format('session %s (%s, %s)', pid, coalesce(nullif(application_name, ''), usename::text, '?'), coalesce(state, '?')),
		       now() - xact_start, greatest(age(backend_xid), age(backend_xmin))::bigint
		FROM pg_stat_activity
		WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND xact_start IS NOT NULL
		  AND pid <> pg_backend_pid() AND datname = current_database()
		  -- VACUUM's own snapshot is ignored by other VACUUMs.
		  AND backend_type <> 'autovacuum worker'
		UNION ALL
		SELECT true, false, format('prepared transaction %s (owner %s)', gid, owner), now() - prepared, age(transaction)::bigint
		FROM pg_prepared_xacts
		WHERE database = current_database()
		UNION ALL
		SELECT false, xmin IS NULL,
		       format('replication slot %s (%s, %s; %s %s transactions old)', slot_name, slot_type,
		              CASE WHEN active THEN 'active' ELSE 'inactive' END,
		              CASE WHEN xmin IS NOT NULL THEN 'xmin' ELSE 'catalog_xmin, which holds back only the system catalogs:' END,
		              coalesce(age(xmin), age(catalog_xmin))),
		       NULL, coalesce(age(xmin), age(catalog_xmin))::bigint
		FROM pg_replication_slots
		WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
		UNION ALL
		SELECT false, false,
		       format('standby feedback through walsender %s (%s; xmin %s transactions old)', pid,
		              coalesce(nullif(application_name, ''), usename::text, '?'), age(backend_xmin)),
		       NULL, age(backend_xmin)::bigint
		FROM pg_stat_activity
		WHERE backend_type = 'walsender' AND backend_xmin IS NOT NULL`

// horizonFrom picks, among holders, the oldest transaction (by start time) and the replication
// hold that reaches further back than every transaction (by transaction id age).
func horizonFrom(holders []horizonHolder) Horizon {
	var (
		h                Horizon
		txXID, replXID   int64
		haveTx, haveRepl bool
		repl             string
	)
	for _, x := range holders {
		xid := int64(0)
		if x.xidAge != nil {
			xid = *x.xidAge
		}
		if !x.catalogOnly {
			h.XIDAge = max(h.XIDAge, xid)
		}
		if !x.timed {
			if !haveRepl || xid > replXID {
				repl, replXID, haveRepl = x.name, xid, true
			}
			continue
		}
		txXID = max(txXID, xid)
		age := time.Duration(0)
		if x.age != nil {
			age = max(*x.age, 0)
		}
		if !haveTx || age > h.OldestTransactionAge {
			h.OldestTransactionAge, h.HeldBy, haveTx = age, x.name, true
		}
	}
	if haveRepl && (!haveTx || replXID > txXID) {
		h.Replication = repl
	}
	return h
}
