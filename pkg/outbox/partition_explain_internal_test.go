package outbox

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/partition"
)

// relayCosts are the buffers each relay statement touched, for one layout of the same rows.
type relayCosts struct {
	partitions                               int
	poll, sweep, read, readRows              int
	settleCustom, settleGeneric, fail, maxID int
	sweepKeys, pollReturn                    int
}

// measureRelay fills the outbox (partitioned first when size > 0) with 120,000 published rows
// in 1,000 keys, statistics taken then, and a burst of 10,000 pending rows in 500 keys plus a
// hot key with 3,000, and measures every relay statement with EXPLAIN (ANALYZE, BUFFERS) in a
// round's transaction (plan guards included).
func measureRelay(t *testing.T, size int64) relayCosts {
	t.Helper()
	ctx := context.Background()
	pool := testdb.Pool(t)
	exec := execOn(t, pool)
	if size > 0 {
		_, err := partition.Convert(ctx, pool, partition.Outbox, &partition.Options{Size: size, Ahead: 10}, nil)
		require.NoError(t, err)
	}
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k' || (i % 1000), '{}', now() FROM generate_series(1, 120000) i`)
	exec(`VACUUM ANALYZE outbox_event`)
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'b' || (i % 500), jsonb_build_object('i', i) FROM generate_series(1, 10000) i`)
	exec(`INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'hot', '{}' FROM generate_series(1, 3000)`)
	var c relayCosts
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_event'::regclass`).Scan(&c.partitions))

	tx := beginWithRoundSettings(t, pool)

	var maxID int64
	require.NoError(t, tx.QueryRow(ctx, maxIDSQL).Scan(&maxID))
	c.maxID, _ = explainBuffers(t, tx, maxIDSQL)
	// Ids the relay saw missing below its frontier: recent ones (it watches each for 30 seconds).
	gaps := []int64{maxID - 3_000, maxID - 2_500, maxID - 2_000, maxID - 1_500, maxID - 1_000, maxID - 700, maxID - 500, maxID - 300, maxID - 200, maxID - 100}
	c.poll, c.pollReturn = explainBuffers(t, tx, pollSQL, maxID-50, pollRows, gaps)
	c.sweep, c.sweepKeys = explainBuffers(t, tx, sweepSQL, "", true, sweepKeys)

	names := []string{"hot"}
	for i := range 500 {
		names = append(names, "b"+strconv.Itoa(i))
	}
	c.read, c.readRows = explainBuffers(t, tx, readSQL, names, 10, 16<<20, settingDefault("MessageLimits.SNS"))

	// Settle 500 of the burst's rows (custom plan: the ids are known when planning), and
	// 500 others with the statement prepared on a session that prefers generic plans, under
	// the settle's own plan setting (settlePlanSQL).
	var ids, other []int64
	rows, err := tx.Query(ctx, `SELECT id FROM outbox_event WHERE published_at IS NULL ORDER BY id LIMIT 1100`)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	ids, other = all[:500], all[500:1000]
	c.settleCustom, _ = explainBuffers(t, tx, settlePublishedSQL, ids)
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = tx.Prepare(ctx, "settle_generic", settlePublishedSQL)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, settlePlanSQL)
	require.NoError(t, err)
	var raw []byte
	lit := make([]string, len(other))
	for i, id := range other {
		lit[i] = strconv.FormatInt(id, 10)
	}
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE settle_generic('{"+strings.Join(lit, ",")+"}')").Scan(&raw))
	c.settleGeneric = planBuffers(t, raw)
	if os.Getenv("SLUICE_EXPLAIN") != "" {
		for _, q := range []struct {
			name, sql string
			args      []any
		}{
			{"settle (generic)", "EXECUTE settle_generic('{" + strings.Join(lit, ",") + "}')", nil},
			{"settle (custom)", settlePublishedSQL, []any{other}},
			{"read", readSQL, []any{names[:3], 10, 16 << 20, settingDefault("MessageLimits.SNS")}},
			{"poll", pollSQL, []any{maxID - 50, pollRows, gaps}},
			{"sweep", sweepSQL, []any{"", true, sweepKeys}},
		} {
			rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+q.sql, q.args...)
			require.NoError(t, err)
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			t.Logf("%s (partitions %d):\n%s", q.name, c.partitions, strings.Join(lines, "\n"))
		}
	}
	_, err = tx.Exec(ctx, "RESET plan_cache_mode")
	require.NoError(t, err)

	fail := all[1000:1100]
	errs, quarantine, delays, attempts := make([]string, len(fail)), make([]bool, len(fail)), make([]*int64, len(fail)), make([]int32, len(fail))
	for i := range fail {
		ms := int64(1000)
		errs[i], delays[i], attempts[i] = "boom", &ms, 1
	}
	c.fail, _ = explainBuffers(t, tx, settleFailedSQL, fail, errs, quarantine, delays, attempts)
	return c
}

func planBuffers(t *testing.T, raw []byte) int {
	t.Helper()
	var plan []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &plan))
	return plan[0].Plan.Hit + plan[0].Plan.Read
}

// The relay's statements stay bounded on a partitioned outbox: with the same 133,000 rows in a
// plain table and in 12 partitions (7 of them holding rows, published or pending), statistics
// taken before the burst, the poll, the sweep and the read touch a number of buffers that
// follows the keys and rows they handle plus a few index descents per partition, never the
// partitions' published rows; settle's UPDATEs look each id up by primary key in the partition
// that holds it.
func TestRelayStatementsStayBoundedOnAPartitionedOutbox(t *testing.T) {
	t.Parallel()
	var plain, parted relayCosts
	done := make(chan struct{})
	go func() {
		defer close(done)
		plain = measureRelay(t, 0)
	}()
	parted = measureRelay(t, 20_000)
	<-done
	t.Logf("plain:       %+v", plain)
	t.Logf("partitioned: %+v", parted)

	n := parted.partitions
	require.Equal(t, 12, n, "7 partitions with rows, 4 ahead, the default one")
	require.Equal(t, 501, plain.sweepKeys)
	require.Equal(t, 501, parted.sweepKeys, "the sweep sees each pending key once")
	require.Equal(t, 5010, parted.readRows)
	require.Equal(t, plain.pollReturn, parted.pollReturn)

	// Poll and max(id): a primary-key descent (three or four buffers) per partition above the
	// frontier, one per gap.
	require.Less(t, parted.poll, plain.poll+4*n, "poll: %d buffers, plain %d", parted.poll, plain.poll)
	require.Less(t, parted.maxID, 4*n, "max(id): %d buffers", parted.maxID)
	// Sweep: per key, one descent of every partition's pending index.
	require.Less(t, parted.sweep, plain.sweep+3*n*parted.sweepKeys, "sweep: %d buffers, plain %d", parted.sweep, plain.sweep)
	// Read: per key, one descent per partition above its floor; per row, as on the plain table.
	require.Less(t, parted.read, plain.read+3*n*501, "read: %d buffers, plain %d", parted.read, plain.read)
	// Settle: one primary-key lookup per id, in the partitions that hold them (pruned by the
	// ids, which the settle always plans for), on both layouts.
	for name, b := range map[string]int{"plain": plain.settleCustom, "partitioned, custom": parted.settleCustom, "partitioned, generic": parted.settleGeneric} {
		require.Less(t, b, 20*500+100, "settle %s: %d buffers for 500 rows", name, b)
	}
	require.Less(t, parted.fail, 20*100+100, "settle of failures: %d buffers for 100 rows", parted.fail)
}
