package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func createEvent(t *testing.T) cfn.Event {
	t.Helper()
	return fixture.Load[cfn.Event](t, "testdata/cfn_create.json")
}

// Create and Update apply the migrations (idempotently); Delete leaves the tables alone.
func TestHandleAppliesMigrationsOnCreateAndUpdateOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	h, err := wire(ctx, func(k string) string { return map[string]string{lambdaenv.DatabaseURL: url}[k] }, slog.New(slog.DiscardHandler))
	require.NoError(t, err)

	ev := createEvent(t)
	id, data, err := h.Handle(ctx, ev)
	require.NoError(t, err)
	require.Equal(t, PhysicalResourceID, id)
	require.EqualValues(t, migrations.Latest(), data["Version"])

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var tables int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename IN ('outbox_event', 'inbox_event')`).Scan(&tables))
	require.Equal(t, 2, tables)

	ev.RequestType = cfn.RequestUpdate
	_, _, err = h.Handle(ctx, ev)
	require.NoError(t, err, "Update on a migrated database is a no-op")

	ev.RequestType = cfn.RequestDelete
	id, _, err = h.Handle(ctx, ev)
	require.NoError(t, err)
	require.Equal(t, PhysicalResourceID, id)
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename IN ('outbox_event', 'inbox_event')`).Scan(&tables))
	require.Equal(t, 2, tables, "Delete keeps the tables")

	ev.RequestType = "Rename"
	_, _, err = h.Handle(ctx, ev)
	require.ErrorContains(t, err, "unknown CloudFormation request type")
}

func TestWireNeedsADatabase(t *testing.T) {
	t.Parallel()
	_, err := wire(context.Background(), func(string) string { return "" }, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "no database configured")
}
