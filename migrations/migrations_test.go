package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/migrations"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestListIsContiguousAndComplete(t *testing.T) {
	t.Parallel()
	ms, err := migrations.List()
	require.NoError(t, err)
	require.NotEmpty(t, ms)
	for i, m := range ms {
		require.Equal(t, int32(i+1), m.Version)
		require.NotEmpty(t, m.Up, "%04d has an up file", m.Version)
		require.NotEmpty(t, m.Down, "%04d has a down file", m.Version)
	}
}

func TestConcurrentMigrationsApplyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			errs[i] = migrations.Up(ctx, conn)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	v, err := migrations.Current(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}

func TestDownRemovesEverythingAndUpRestores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)

	require.NoError(t, migrations.To(ctx, conn, 0))
	var tables int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'sluice_schema_version'`).Scan(&tables))
	require.Zero(t, tables, "down to 0 leaves no sluice table")

	require.NoError(t, migrations.Up(ctx, conn))
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = 'outbox_event'`).Scan(&tables))
	require.Equal(t, 1, tables)
}
