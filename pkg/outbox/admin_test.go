package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/admin"
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

// An empty selection is a mistake (a filter that matched nothing), never "all": nil and an
// empty slice change nothing; RetryAllQuarantined is the explicit "all".
func TestRetryQuarantinedWithEmptySelectionChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 3, 3)
	_, err := b.pool.Exec(ctx, `UPDATE outbox_event SET quarantined_at = now(), attempts = 10`)
	require.NoError(t, err)
	for _, ids := range [][]int64{nil, {}} {
		_, err := outbox.RetryQuarantined(ctx, b.pool, ids)
		require.ErrorIs(t, err, admin.ErrNothingSelected, "the same error as the inbox's")
	}
	require.Equal(t, 3, b.countWhere(t, "quarantined_at IS NOT NULL"), "nothing released")

	n, err := outbox.RetryQuarantined(ctx, b.pool, []int64{1, 999})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "ids that are not quarantined are ignored")
	n, err = outbox.RetryAllQuarantined(ctx, b.pool)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Zero(t, b.countWhere(t, "quarantined_at IS NOT NULL OR attempts <> 0"))
}

func TestPurgeRefusesANegativeBatchSize(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := outbox.Purge(context.Background(), b.pool, time.Hour, &outbox.PurgeOptions{BatchSize: -1})
	require.ErrorIs(t, err, admin.ErrInvalidBatchSize, "the same error as the inbox's")
}

// holdTx opens a transaction on a connection of its own (named application in
// pg_stat_activity), runs stmts in it and leaves it open, idle in transaction, until the test
// ends. It returns the connection's backend pid. The statements go by the simple protocol
// (Exec without arguments): an extended-protocol query would leave its portal, and the
// portal's snapshot, open until the next one.
func holdTx(t *testing.T, b *bundle, application string, iso pgx.TxIsoLevel, stmts ...string) (pid int32) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	_, err = conn.Exec(ctx, "SET application_name = '"+application+"'")
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	for _, s := range stmts {
		_, err := tx.Exec(ctx, s)
		require.NoError(t, err)
	}
	return pid
}

// The commonest VACUUM blocker: a READ COMMITTED transaction that wrote a row and sits idle.
// Between statements it holds no snapshot (backend_xmin is NULL), but its transaction id keeps
// every row version deleted after it began.
func TestHorizonNamesAnIdleReadCommittedWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	h, err := outbox.HorizonOf(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, outbox.Horizon{}, h, "nothing holds the horizon of a fresh database")

	pid := holdTx(t, b, "forgotten-psql", pgx.ReadCommitted, "CREATE TEMP TABLE scratch (n int)", "INSERT INTO scratch VALUES (1)")
	var noSnapshot, hasXID bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT backend_xmin IS NULL, backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = $1", pid).
		Scan(&noSnapshot, &hasXID))
	require.True(t, noSnapshot && hasXID, "the writer holds a transaction id and no snapshot")

	h, err = outbox.HorizonOf(ctx, b.pool)
	require.NoError(t, err)
	require.Contains(t, h.HeldBy, fmt.Sprintf("session %d (forgotten-psql, idle in transaction)", pid))
	require.Positive(t, h.OldestTransactionAge)
	require.Positive(t, h.XIDAge)
	require.Empty(t, h.Replication)
}

func TestHorizonNamesARepeatableReadSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	holdTx(t, b, "nightly-report", pgx.RepeatableRead, "SELECT count(*) FROM outbox_event")
	// A younger writer: the report, which began first, is the oldest transaction.
	holdTx(t, b, "young-writer", pgx.ReadCommitted, "CREATE TEMP TABLE scratch (n int)", "INSERT INTO scratch VALUES (1)")

	h, err := outbox.HorizonOf(ctx, b.pool)
	require.NoError(t, err)
	require.Contains(t, h.HeldBy, "nightly-report, idle in transaction")
	require.Positive(t, h.OldestTransactionAge)
	require.Positive(t, h.XIDAge)
}

// A prepared transaction outlives its session and holds the horizon until COMMIT PREPARED or
// ROLLBACK PREPARED; it is the oldest here, older than a session's transaction begun after it.
func TestHorizonNamesAPreparedTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var maxPrepared int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&maxPrepared))
	if maxPrepared == 0 {
		t.Skip("max_prepared_transactions is 0 on this server, so no transaction can be prepared: " +
			"run with TEST_DATABASE_URL naming a server started with -c max_prepared_transactions=10 to test them")
	}
	gid := "sluice-horizon-" + uuid.NewString()
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "BEGIN; CREATE TABLE prepared_scratch (n int); INSERT INTO prepared_scratch VALUES (1); PREPARE TRANSACTION '"+gid+"'")
	conn.Release()
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.WithoutCancel(ctx), "ROLLBACK PREPARED '"+gid+"'") })
	holdTx(t, b, "later-report", pgx.RepeatableRead, "SELECT 1")

	h, err := outbox.HorizonOf(ctx, b.pool)
	require.NoError(t, err)
	require.Contains(t, h.HeldBy, "prepared transaction "+gid)
	require.Positive(t, h.XIDAge)
}
