package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestPurgeDeletesOnlyOldPublishedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 30, 3)
	// 10 old published, 10 recently published, 5 old unpublished, 5 old quarantined.
	_, err := b.pool.Exec(ctx, `UPDATE outbox_event SET published_at = now() - interval '10 days', created_at = now() - interval '11 days' WHERE id <= 10`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET published_at = now() WHERE id BETWEEN 11 AND 20`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET created_at = now() - interval '11 days' WHERE id BETWEEN 21 AND 25`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET created_at = now() - interval '11 days', quarantined_at = now() - interval '10 days' WHERE id > 25`)
	require.NoError(t, err)

	n, err := outbox.Purge(ctx, b.pool, 7*24*time.Hour, &outbox.PurgeOptions{BatchSize: 3})
	require.NoError(t, err)
	require.Equal(t, int64(10), n)
	require.Zero(t, b.countWhere(t, "id <= 10"))
	require.Equal(t, 10, b.countWhere(t, "published_at IS NOT NULL"), "recent published rows stay")
	require.Equal(t, 10, b.countWhere(t, "published_at IS NULL"), "unpublished and quarantined rows are never purged")

	_, err = outbox.Purge(ctx, b.pool, 0, nil)
	require.ErrorContains(t, err, "positive retention")
}

func TestLagReportsPendingOldestAndQuarantined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	lag, err := outbox.LagOf(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, outbox.Lag{}, lag, "an empty outbox has no lag")

	b.write(t, 5, 5)
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET created_at = now() - interval '90 seconds' WHERE id = 1;
		UPDATE outbox_event SET quarantined_at = now() WHERE id = 2;
		UPDATE outbox_event SET published_at = now() WHERE id = 3`)
	require.NoError(t, err)
	lag, err = outbox.LagOf(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, int64(3), lag.Pending)
	require.Equal(t, int64(1), lag.Quarantined)
	require.Equal(t, int64(1), lag.PublishedLastMinute)
	require.InDelta(t, 90, lag.OldestPendingAge.Seconds(), 5)
}

func TestReplayPublishesTheChosenRowsAgainWithTheSameEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	written := b.write(t, 6, 2)
	r := b.relay(t)
	_, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, b.rec.count())

	f := outbox.ReplayFilter{Since: time.Now().Add(-time.Hour), AggregateID: written[2].AggregateID}
	n, err := outbox.CountReplay(ctx, b.pool, f)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	n, err = outbox.Replay(ctx, b.pool, f)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Published)
	require.Equal(t, written[2].EventID, b.rec.received[6].EventID, "same event id, so existing consumers deduplicate")

	_, err = outbox.Replay(ctx, b.pool, outbox.ReplayFilter{})
	require.ErrorContains(t, err, "start time")
	_, err = outbox.Replay(ctx, b.pool, outbox.ReplayFilter{Since: time.Now(), Until: time.Now().Add(-time.Hour)})
	require.ErrorContains(t, err, "range is empty")
}

func TestRetryQuarantinedWithEmptySelectionChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := outbox.RetryQuarantined(context.Background(), b.pool, []int64{})
	require.ErrorIs(t, err, outbox.ErrNothingSelected)
}
