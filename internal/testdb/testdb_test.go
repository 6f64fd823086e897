package testdb_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/migrations"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestEachTestGetsItsOwnMigratedDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testdb.Pool(t), testdb.Pool(t)

	_, err := a.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES (gen_random_uuid(), 't', 'order', '1', 'OrderCreated', '1', '{}')`)
	require.NoError(t, err)

	var inA, inB int
	require.NoError(t, a.QueryRow(ctx, "SELECT count(*) FROM outbox_event").Scan(&inA))
	require.NoError(t, b.QueryRow(ctx, "SELECT count(*) FROM outbox_event").Scan(&inB))
	require.Equal(t, 1, inA)
	require.Equal(t, 0, inB)

	conn, err := a.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	v, err := migrations.Current(ctx, conn.Conn())
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}
