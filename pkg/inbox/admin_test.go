package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestPurgeDeletesOnlyOldProcessedRowsInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	recs := batchOf()
	for i, id := range ids(25, "old") {
		recs.Records = append(recs.Records, rec(id, script{N: i}))
	}
	newConsumer(t, b.pool, "billing", inbox.PerRecord).Process(ctx, recs)
	newConsumer(t, b.pool, "shipping", inbox.PerRecord).Process(ctx, batchOf(rec("s1", script{N: 1})))
	// Unprocessed (async) and parked rows are never purged, however old.
	newAsync(t, b, "billing").Process(ctx, batchOf(rec("pending", script{N: 1}), rec("parked", script{N: 2})))
	_, err := b.pool.Exec(ctx, `UPDATE inbox_event SET received_at = now() - interval '30 days',
		processed_at = CASE WHEN processed_at IS NOT NULL THEN now() - interval '30 days' END,
		parked_at = CASE WHEN message_id = 'parked' THEN now() END`)
	require.NoError(t, err)
	newConsumer(t, b.pool, "billing", inbox.PerRecord).Process(ctx, batchOf(rec("fresh", script{N: 9})))

	n, err := inbox.Purge(ctx, b.pool, 14*24*time.Hour, &inbox.PurgeOptions{Consumer: "shipping"})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the consumer filter holds")

	n, err = inbox.Purge(ctx, b.pool, 14*24*time.Hour, &inbox.PurgeOptions{BatchSize: 10})
	require.NoError(t, err)
	require.EqualValues(t, 25, n, "three batches of at most 10")
	require.Equal(t, []string{"billing/fresh/true", "billing/parked/false", "billing/pending/false"}, dbState(t, b.pool).Inbox)

	n, err = inbox.Purge(ctx, b.pool, 14*24*time.Hour, nil)
	require.NoError(t, err)
	require.Zero(t, n)

	_, err = inbox.Purge(ctx, b.pool, 0, nil)
	require.ErrorIs(t, err, inbox.ErrInvalidArgument)
	_, err = inbox.Purge(ctx, b.pool, time.Hour, &inbox.PurgeOptions{BatchSize: -1})
	require.ErrorIs(t, err, inbox.ErrInvalidArgument)
	require.ErrorIs(t, err, inbox.ErrInvalidBatchSize)
	require.ErrorIs(t, err, admin.ErrInvalidBatchSize, "the same error as the outbox's")
	require.Equal(t, outbox.DefaultPurgeBatchSize, inbox.DefaultPurgeBatchSize)
}

// An empty selection is a mistake (a filter that matched nothing), never "all", exactly as in
// the outbox: RetryAllParked is the explicit "all".
func TestRetryParkedWithEmptySelectionChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	newAsync(t, b, "a").Process(ctx, batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2})))
	_, err := b.pool.Exec(ctx, `UPDATE inbox_event SET parked_at = now(), attempts = 5`)
	require.NoError(t, err)
	for _, ids := range [][]string{nil, {}} {
		_, err := inbox.RetryParked(ctx, b.pool, "a", ids)
		require.ErrorIs(t, err, inbox.ErrNothingSelected)
		require.ErrorIs(t, err, admin.ErrNothingSelected, "the same error as the outbox's")
	}
	lag, err := inbox.LagOf(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []inbox.Lag{{Consumer: "a", Parked: 2}}, lag, "nothing un-parked")

	n, err := inbox.RetryAllParked(ctx, b.pool, "a")
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
}

func TestLagPerConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	newAsync(t, b, "a").Process(ctx, batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2})))
	newAsync(t, b, "b").Process(ctx, batchOf(rec("m1", script{N: 1})))
	_, err := b.pool.Exec(ctx, `UPDATE inbox_event SET received_at = now() - interval '90 seconds' WHERE consumer = 'a' AND message_id = 'm1'`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE inbox_event SET parked_at = now() WHERE consumer = 'b'`)
	require.NoError(t, err)

	st, err := inbox.LagOf(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, st, 2)
	require.Equal(t, "a", st[0].Consumer)
	require.EqualValues(t, 2, st[0].Unprocessed)
	require.InDelta(t, 90, st[0].OldestUnprocessedAge.Seconds(), 10)
	require.Equal(t, inbox.Lag{Consumer: "b", Parked: 1}, st[1])

	parked, err := inbox.ListParked(ctx, b.pool, "", 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "b", parked[0].Consumer)
}

func TestMigrationDownAndUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// The unique key is (consumer, message_id): the same id for two consumers is two rows.
	_, err := b.pool.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type) VALUES ('a', 'm', 'X'), ('b', 'm', 'X')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type) VALUES ('a', 'm', 'X')`)
	require.Error(t, err)
	var idx int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = 'inbox_event' AND indexdef LIKE '%WHERE%processed_at IS NULL%'`).Scan(&idx))
	require.GreaterOrEqual(t, idx, 2, "partial indexes on unprocessed rows")
}
