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
	exec := func(sql string, args ...any) {
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
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
	exec := func(sql string) {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
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
