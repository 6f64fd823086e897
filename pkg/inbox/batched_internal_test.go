package inbox

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
)

func TestRecordGroupComesFromSQS(t *testing.T) {
	t.Parallel()
	fifo := record{delivery: sqsDelivery(events.SQSMessage{MessageId: "s1", Body: "unparseable", Attributes: map[string]string{"MessageGroupId": "g1"}})}
	require.Error(t, fifo.err)
	require.Equal(t, "g1", fifo.group(), "a record that could not be parsed still has its group")
	require.Empty(t, (&record{delivery: sqsDelivery(events.SQSMessage{})}).group())
}

func TestBatchRowsFreeTakeAndFreeIDs(t *testing.T) {
	t.Parallel()
	var none batchRows
	require.False(t, none.free("m1"), "no insert: every record is a duplicate")

	rows := batchRows{"m3": rowFree, "m1": rowFree, "m2": rowFree}
	require.True(t, rows.free("m1"))
	require.False(t, rows.free("m9"), "not inserted by this transaction: a duplicate")
	rows.take("m1")
	require.False(t, rows.free("m1"), "a later record with the same id is a duplicate of the first")
	require.Equal(t, []string{"m2", "m3"}, rows.freeIDs())
	rows.take("m2")
	rows.take("m3")
	require.Empty(t, rows.freeIDs())
}

// The one savepoint helper keeps what succeeded, undoes a failing record alone (an error, or a
// statement failure the work swallowed), and breaks the transaction only when a savepoint
// command itself fails.
func TestBatchTxSavepoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE sp (n int NOT NULL)`)
	require.NoError(t, err)
	insert := func(tx *batchTx, n int) func() error {
		return func() error { _, err := tx.tx.Exec(ctx, `INSERT INTO sp VALUES ($1)`, n); return err }
	}
	committed := func() []int {
		rows, err := pool.Query(ctx, `SELECT n FROM sp ORDER BY n`)
		require.NoError(t, err)
		ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		return ns
	}

	bt := &batchTx{db: pool}
	defer bt.close(ctx)
	began, err := bt.begin(ctx)
	require.NoError(t, err)
	require.True(t, began)
	began, err = bt.begin(ctx)
	require.NoError(t, err)
	require.False(t, began, "the transaction is begun once")

	require.NoError(t, bt.savepoint(ctx, "m1", insert(bt, 1)))
	boom := errors.New("boom")
	require.ErrorIs(t, bt.savepoint(ctx, "m2", func() error { _ = insert(bt, 2)(); return boom }), boom)
	err = bt.savepoint(ctx, "m3", func() error {
		_ = insert(bt, 3)()
		_, _ = bt.tx.Exec(ctx, `SELECT 1/0`) // swallowed
		return nil
	})
	require.ErrorContains(t, err, "message m3: release savepoint")
	require.NoError(t, bt.broken, "a failing record does not break the batch")
	require.NoError(t, bt.savepoint(ctx, "m4", insert(bt, 4)))
	require.NoError(t, bt.commit(ctx, nil))
	require.Equal(t, []int{1, 4}, committed())

	// Work that destroys the savepoint breaks the transaction: nothing of it commits.
	bt2 := &batchTx{db: pool}
	defer bt2.close(ctx)
	_, err = bt2.begin(ctx)
	require.NoError(t, err)
	require.NoError(t, bt2.savepoint(ctx, "m5", insert(bt2, 5)))
	err = bt2.savepoint(ctx, "m6", func() error {
		_, _ = bt2.tx.Exec(ctx, `RELEASE SAVEPOINT inbox_record`)
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, bt2.broken, "batch transaction unusable after message m6 failed")
	require.ErrorIs(t, bt2.commit(ctx, nil), bt2.broken)
	bt2.close(ctx)
	require.Equal(t, []int{1, 4}, committed())

	// A failing step before the commit fails it with ErrCommit.
	bt3 := &batchTx{db: pool}
	defer bt3.close(ctx)
	_, err = bt3.begin(ctx)
	require.NoError(t, err)
	require.NoError(t, bt3.savepoint(ctx, "m7", insert(bt3, 7)))
	require.ErrorIs(t, bt3.commit(ctx, func() error { return boom }), ErrCommit)
	bt3.close(ctx)
	require.Equal(t, []int{1, 4}, committed())
}
