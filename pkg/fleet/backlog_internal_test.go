package fleet

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// TestBacklogAtStartNeedsAFullBatchPerPipelineOfNewOutboxRows: a turn grows before its first
// pass only on a full batch per pipeline of rows added to the outbox since the tenant last
// knew its end, seen by its looks or counted by its server's activity poll and found in the
// outbox; inserts into other tables (counted by the poll, absent from the outbox) are not a
// backlog. A write transaction the poll saw end has the outbox read before its rows are counted.
func TestBacklogAtStartNeedsAFullBatchPerPipelineOfNewOutboxRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	write := func(n int) {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k' || i, '{}' FROM generate_series(1, $1::int) i`, n)
		require.NoError(t, err)
	}
	tn := &tenant{f: &Fleet{cfg: Config{Relay: outbox.RelayConfig{BatchSize: 10}}}, pool: pool}
	write(5)
	_, err := tn.readHead(ctx)
	require.NoError(t, err)

	write(9)
	require.False(t, tn.backlogAtStart(ctx, 9, 0, false, 1), "9 new rows: less than a batch")
	write(10)
	require.False(t, tn.backlogAtStart(ctx, 5, 0, false, 1), "the poll counted less than a batch: the outbox is not read")
	require.True(t, tn.backlogAtStart(ctx, 10, 0, false, 1), "19 rows since the head the tenant knew")
	require.False(t, tn.backlogAtStart(ctx, 50, 0, false, 1), "50 inserts counted, none of them into the outbox since")
	write(15)
	require.False(t, tn.backlogAtStart(ctx, 15, 0, false, 2), "two pipelines: a backlog is 20 rows")
	require.True(t, tn.backlogAtStart(ctx, 0, 20, false, 2), "the parked looks saw 20 rows added")
	require.False(t, tn.backlogAtStart(ctx, 0, 19, false, 2), "and 19 are not enough")
	// A parked tenant's looks moved its head as they saw rows: the rows after the last look
	// add to theirs.
	write(12)
	_, err = tn.readHead(ctx) // the last look, which saw the 12
	require.NoError(t, err)
	write(10)
	require.True(t, tn.backlogAtStart(ctx, 22, 12, false, 2), "12 rows seen by the looks and 10 since the last: a batch for each of two pipelines")
	// A write transaction seen ending: the outbox is read before the statistics count its rows.
	write(10)
	require.False(t, tn.backlogAtStart(ctx, 0, 0, false, 1), "nothing counted, no write seen ending: the outbox is not read")
	require.True(t, tn.backlogAtStart(ctx, 0, 0, true, 1), "a write ended: its 10 rows are a batch")
	write(5)
	require.False(t, tn.backlogAtStart(ctx, 0, 0, true, 1), "5 rows since the last read: less than a batch")
}
