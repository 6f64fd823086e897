package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/partition"
)

// dedupCosts are the buffers the inbox insert touched for one new message, one duplicate, and a
// batch of 100 new messages, with the given number of partitions holding rows (0: plain table).
type dedupCosts struct {
	partitions, one, duplicate, batch int
}

func explainInsert(t *testing.T, tx pgx.Tx, sql string, args ...any) int {
	t.Helper()
	var raw []byte
	require.NoError(t, tx.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw))
	var plan []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &plan))
	return plan[0].Plan.Hit + plan[0].Plan.Read
}

// measureDedup stores 40,000 processed messages of one consumer, spread over parts hourly
// partitions (a plain table when parts is 0), and measures the insert of new and duplicate
// messages.
func measureDedup(t *testing.T, parts int) dedupCosts {
	t.Helper()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := dedupCosts{partitions: parts}
	spread := "now()"
	if parts > 0 {
		_, err := partition.Convert(ctx, pool, partition.Inbox, &partition.Options{Interval: time.Hour, Ahead: parts}, nil)
		require.NoError(t, err)
		// Into the partitions created ahead: hours 2 .. parts+1 from now.
		spread = fmt.Sprintf("date_trunc('hour', now()) + interval '2 hours' + (i %% %d) * interval '1 hour'", parts)
	}
	_, err := pool.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, received_at, processed_at)
		SELECT 'billing', 'old-' || i, 'E', `+spread+`, now() FROM generate_series(1, 40000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "VACUUM ANALYZE inbox_event")
	require.NoError(t, err)
	if parts > 0 {
		var held int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM inbox_event`).Scan(&held))
		require.Equal(t, parts, held)
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	one, dup, batch := insertSync, insertSync, insertBatch
	if parts > 0 {
		one, dup, batch = insertSyncPartitioned, insertSyncPartitioned, insertBatchPartitioned
	}
	args := func(id string) []any {
		return []any{"billing", id, "E", "", "", "", nil, map[string]string{}, nil}
	}
	c.one = explainInsert(t, tx, one, args("new-1")...)
	c.duplicate = explainInsert(t, tx, dup, args("old-777")...)
	n := 100
	ids, empty, created, headers, payloads := make([]string, n), make([]string, n), make([]*time.Time, n), make([]string, n), make([]*string, n)
	types := make([]string, n)
	for i := range n {
		ids[i], types[i], headers[i] = fmt.Sprintf("batch-%03d", i), "E", "{}"
	}
	c.batch = explainInsert(t, tx, batch, "billing", ids, types, empty, empty, empty, created, headers, payloads)
	return c
}

// The dedup check of a partitioned inbox costs one index descent per partition per message,
// whatever the number of rows stored: with 40,000 stored messages spread over 24 partitions, a
// new message, a duplicate and a batch of 100 stay within a few buffers per partition each.
func TestPartitionedInboxDedupCostsADescentPerPartition(t *testing.T) {
	t.Parallel()
	var plain, parted dedupCosts
	done := make(chan struct{})
	go func() {
		defer close(done)
		plain = measureDedup(t, 0)
	}()
	parted = measureDedup(t, 24)
	<-done
	t.Logf("plain:          %+v", plain)
	t.Logf("24 partitions:  %+v", parted)
	n := parted.partitions
	require.Less(t, parted.one, plain.one+4*n, "a new message: %d buffers, plain %d", parted.one, plain.one)
	require.Less(t, parted.duplicate, plain.duplicate+4*n, "a duplicate: %d buffers, plain %d", parted.duplicate, plain.duplicate)
	require.Less(t, parted.batch, plain.batch+4*n*100, "100 new messages: %d buffers, plain %d", parted.batch, plain.batch)
}
