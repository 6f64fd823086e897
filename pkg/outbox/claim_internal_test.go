package outbox

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
)

// explainBuffers runs sql under EXPLAIN (ANALYZE, BUFFERS) in tx and returns the shared buffers
// it touched (hits and reads) and the rows its top node returned.
func explainBuffers(t *testing.T, tx pgx.Tx, sql string, args ...any) (buffers, rows int) {
	t.Helper()
	var raw []byte
	require.NoError(t, tx.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw))
	var plan []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
			Rows int `json:"Actual Rows"`
		} `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &plan))
	return plan[0].Plan.Hit + plan[0].Plan.Read, plan[0].Plan.Rows
}

// beginWithRoundSettings opens a transaction with a round's settings (made local to it), for
// EXPLAIN.
func beginWithRoundSettings(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	for _, set := range roundSettings(30*time.Second, true) {
		_, err := tx.Exec(ctx, strings.Replace(set, "SET ", "SET LOCAL ", 1))
		require.NoError(t, err)
	}
	return tx
}

// Scenario 0 of issue 10, measured where it matters: with statistics taken on an empty backlog
// and 20,000 published rows retained, every statement of a round touches a bounded number of
// buffers per key and row it handles, instead of rescanning the backlog per candidate.
func TestRoundStatementsAreBoundedWithStatisticsFromAnEmptyBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	exec := execOn(t, pool)
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k' || (i % 1000), '{}', now() FROM generate_series(1, 20000) i`)
	exec(`VACUUM ANALYZE outbox_event`)
	// The burst: 10,000 rows in 500 keys, and a hot key with 3,000 rows.
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'b' || (i % 500), jsonb_build_object('i', i) FROM generate_series(1, 10000) i`)
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'hot', '{}' FROM generate_series(1, 3000)`)

	tx := beginWithRoundSettings(t, pool)

	buffers, keys := explainBuffers(t, tx, sweepSQL, "", true, sweepKeys)
	require.Equal(t, 501, keys, "the sweep sees each pending key once")
	require.Less(t, buffers, 10*keys+100, "sweep: %d buffers for %d keys", buffers, keys)

	names := make([]string, 0, 501)
	names = append(names, "hot")
	for i := range 500 {
		names = append(names, "b"+strconv.Itoa(i))
	}
	buffers, locked := explainBuffers(t, tx, lockKeysSQL, names)
	require.Equal(t, 501, locked)
	require.Less(t, buffers, 100, "locking keys reads no table")

	const perKey = 10
	buffers, rows := explainBuffers(t, tx, readSQL, names, perKey, 16<<20, settingDefault("MessageLimits.SNS"))
	require.Equal(t, 501*perKey, rows)
	require.Less(t, buffers, 10*rows+10*len(names)+100, "read: %d buffers for %d rows; the hot key's 3,000 rows are not scanned", buffers, rows)

	// Recording outcomes: one primary-key lookup per row, not a scan of the 13,000 pending rows.
	var ids []int64
	idRows, err := tx.Query(ctx, `SELECT id FROM outbox_event WHERE partition_key LIKE 'b%' AND published_at IS NULL ORDER BY id LIMIT 500`)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(idRows, pgx.RowTo[int64])
	require.NoError(t, err)
	buffers, _ = explainBuffers(t, tx, settlePublishedSQL, ids)
	require.Less(t, buffers, 20*len(ids)+100, "settle published: %d buffers for %d rows", buffers, len(ids))
	errs, quarantine, delays, attempts := make([]string, 100), make([]bool, 100), make([]*int64, 100), make([]int32, 100)
	buffers, _ = explainBuffers(t, tx, settleFailedSQL, ids[:100], errs, quarantine, delays, attempts)
	require.Less(t, buffers, 20*100+100, "settle failed: %d buffers for 100 rows", buffers)
}

// Isolation scenario (d) of the benchmarks: statistics taken while one key held every pending
// row (50,000 behind its quarantined head), then other keys get rows. The read must still reach
// each key through the pending-key index, not walk the primary key past the big key's rows for
// every other key.
func TestReadUsesThePendingKeyIndexWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	exec := execOn(t, pool)
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'parked', '{}' FROM generate_series(1, 50000)`)
	exec(`VACUUM ANALYZE outbox_event`)
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'idle-' || i, '{}' FROM generate_series(1, 20) i`)
	tx := beginWithRoundSettings(t, pool)
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = "idle-" + strconv.Itoa(i+1)
	}
	for _, mode := range []string{"auto", "force_generic_plan"} {
		_, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
		require.NoError(t, err)
		buffers, rows := explainBuffers(t, tx, readSQL, keys, 10, 16<<20, settingDefault("MessageLimits.SNS"))
		require.Equal(t, 20, rows)
		require.Less(t, buffers, 10*len(keys)+50, "%s plan: %d buffers to read 20 rows of 20 keys", mode, buffers)
	}
}

// A burst of 100,000 pending rows arrives at an outbox whose rows were all published, on a
// round's connection that has cached its plans for recording outcomes (a long-lived relay;
// PostgreSQL keeps a prepared statement's generic plan until the table's statistics change,
// which autovacuum may take a minute to do). Recording a round's outcomes must still touch a
// bounded number of buffers per row, in the cached plan and in a fresh one. A join of the ids
// against the table, planned for a table of a few rows with the plan guards on, put the table
// outside and the ids inside: one pass over the table per id (the fleet benchmark's
// backlogged tenant took 15 s to record 500 rows; the settle timed out and the round's rows
// were published again).
func TestSettleIsBoundedAfterABurstOnACachedPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	exec := execOn(t, pool)
	exec(`ALTER TABLE outbox_event SET (autovacuum_enabled = false)`)
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k' || i, '{}', now() FROM generate_series(1, 50) i`)
	exec(`ANALYZE outbox_event`)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	run := func(sql string) {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	for _, set := range roundSettings(30*time.Second, true) {
		run(set)
	}
	run(`SET plan_cache_mode = force_generic_plan`)
	defer run(`DEALLOCATE ALL; RESET plan_cache_mode; ` + roundEndSQL(true))
	run(`PREPARE settle_published(bigint[]) AS ` + settlePublishedSQL)
	run(`PREPARE settle_failed(bigint[], text[], bool[], bigint[], int[]) AS ` + settleFailedSQL)
	run(`EXECUTE settle_published('{0}')`) // planned now, for a table of 50 published rows
	run(`EXECUTE settle_failed('{0}', '{x}', '{f}', '{NULL}', '{1}')`)

	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k' || (i % 100), '{}' FROM generate_series(1, 100000) i`)
	const n = 50
	idRows, err := pool.Query(ctx, `SELECT id FROM outbox_event WHERE published_at IS NULL ORDER BY id LIMIT $1`, n)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(idRows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, n)
	idList := make([]string, n)
	for i, id := range ids {
		idList[i] = strconv.FormatInt(id, 10)
	}
	// EXPLAIN EXECUTE takes no parameters: the arrays are written out.
	idArray := "'{" + strings.Join(idList, ",") + "}'"
	array := func(elem string) string { return "'{" + strings.Repeat(elem+",", n-1) + elem + "}'" }
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	buffers, _ := explainBuffers(t, tx, `EXECUTE settle_published(`+idArray+`)`)
	require.Less(t, buffers, 20*n+100, "cached plan: settle published: %d buffers for %d rows", buffers, n)
	buffers, _ = explainBuffers(t, tx, `EXECUTE settle_failed(`+idArray+`, `+array("x")+`, `+array("f")+`, `+array("NULL")+`, `+array("1")+`)`)
	require.Less(t, buffers, 20*n+100, "cached plan: settle failed: %d buffers for %d rows", buffers, n)
	require.NoError(t, tx.Rollback(ctx))

	errs, quarantine, delays, attempts := make([]string, n), make([]bool, n), make([]*int64, n), make([]int32, n)
	for _, mode := range []string{"auto", "force_generic_plan"} {
		tx := beginWithRoundSettings(t, pool)
		_, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
		require.NoError(t, err)
		buffers, _ := explainBuffers(t, tx, settlePublishedSQL, ids)
		require.Less(t, buffers, 20*n+100, "%s plan: settle published: %d buffers for %d rows", mode, buffers, n)
		buffers, _ = explainBuffers(t, tx, settleFailedSQL, ids, errs, quarantine, delays, attempts)
		require.Less(t, buffers, 20*n+100, "%s plan: settle failed: %d buffers for %d rows", mode, buffers, n)
		require.NoError(t, tx.Rollback(ctx))
	}
}

// settleFailedSQL gives each row its own values, whatever order the round's failures came in
// (failedArgs sorts them by id for the statement's binary search).
func TestSettleFailedRecordsEachRowItsOwnValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	idRows, err := pool.Query(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, attempts)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k' || i, '{}', i FROM generate_series(1, 5) i RETURNING id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(idRows, pgx.RowTo[int64])
	require.NoError(t, err)
	delay := int64(60_000)
	rows := []failedRow{ // not in id order; ids[2] is not among them
		{id: ids[4], err: "e4", quarantine: true, attempt: 1},
		{id: ids[0], err: "e0", delayMS: &delay, attempt: 1},
		{id: ids[3], err: "e3", attempt: 0},
		{id: ids[1], err: "e1", delayMS: &delay, attempt: 2},
	}
	_, err = pool.Exec(ctx, settleFailedSQL, failedArgs(rows)...)
	require.NoError(t, err)
	type state struct {
		Attempts              int
		LastError             *string
		Quarantined, Deferred bool
	}
	got, err := pool.Query(ctx, `SELECT attempts, last_error, quarantined_at IS NOT NULL, available_at > now() + interval '30 seconds'
		FROM outbox_event ORDER BY id`)
	require.NoError(t, err)
	states, err := pgx.CollectRows(got, func(r pgx.CollectableRow) (state, error) {
		var s state
		var deferred *bool
		err := r.Scan(&s.Attempts, &s.LastError, &s.Quarantined, &deferred)
		s.Deferred = deferred != nil && *deferred
		return s, err
	})
	require.NoError(t, err)
	text := func(s string) *string { return &s }
	require.Equal(t, []state{
		{Attempts: 2, LastError: text("e0"), Deferred: true},
		{Attempts: 4, LastError: text("e1"), Deferred: true},
		{Attempts: 3},
		{Attempts: 4, LastError: text("e3")},
		{Attempts: 6, LastError: text("e4"), Quarantined: true},
	}, states)
}

// execOn returns a function that runs a statement on pool and fails t if it errs.
func execOn(t *testing.T, pool *pgxpool.Pool) func(sql string, args ...any) {
	return func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(context.Background(), sql, args...)
		require.NoError(t, err)
	}
}
