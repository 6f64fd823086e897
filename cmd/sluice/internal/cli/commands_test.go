package cli_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// Every command is a function with options and a result; bad options are ErrUsage, recognised
// without reading the message, and change nothing.
func TestCommandFunctionsReportBadOptionsAsUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.insertOutbox(t, outboxRow{quarantined: true})
	before := b.fingerprint(t)
	for name, call := range map[string]func() error{
		"ListDead without a limit": func() error { _, err := cli.ListDead(ctx, b.pool, cli.DeadListOptions{}); return err },
		"RetryDead with nothing":   func() error { _, err := cli.RetryDead(ctx, b.pool, cli.DeadRetryOptions{}); return err },
		"RetryDead with all and ids": func() error {
			_, err := cli.RetryDead(ctx, b.pool, cli.DeadRetryOptions{All: true, IDs: []string{"1"}})
			return err
		},
		"RetryDead with a bad id": func() error {
			_, err := cli.RetryDead(ctx, b.pool, cli.DeadRetryOptions{IDs: []string{"x"}})
			return err
		},
		"Purge without a retention": func() error { _, err := cli.Purge(ctx, b.pool, nil, cli.PurgeOptions{}); return err },
		"Purge of neither table": func() error {
			_, err := cli.Purge(ctx, b.pool, nil, cli.PurgeOptions{OlderThan: time.Hour, OutboxOnly: true, InboxOnly: true})
			return err
		},
		"Replay without since":  func() error { _, err := cli.Replay(ctx, b.pool, cli.ReplayOptions{}); return err },
		"Redrive without a DLQ": func() error { _, err := cli.Redrive(ctx, nil, cli.RedriveOptions{}); return err },
		"Redrive with a negative max": func() error {
			_, err := cli.Redrive(ctx, nil, cli.RedriveOptions{DLQ: "http://q", Max: -1})
			return err
		},
	} {
		err := call()
		require.ErrorIs(t, err, cli.ErrUsage, name)
	}
	require.Equal(t, before, b.fingerprint(t))
	_, err := cli.RetryDead(ctx, b.pool, cli.DeadRetryOptions{IDs: []string{"999"}})
	require.Error(t, err)
	require.False(t, errors.Is(err, cli.ErrUsage), "a row that is not quarantined is not a usage error")
}

// The functions do what the commands print, without a command line.
func TestCommandFunctionsWithoutTheCommandLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	q, _ := b.insertOutbox(t, outboxRow{aggID: "o-1", quarantined: true})
	b.insertOutbox(t, outboxRow{aggID: "o-2", age: 48 * time.Hour, publishedAgo: ago(40 * time.Hour)})
	b.insertInbox(t, "billing", "m-1", "parked", time.Hour)

	list, err := cli.ListDead(ctx, b.pool, cli.DeadListOptions{Limit: 10})
	require.NoError(t, err)
	require.Len(t, list.Quarantined, 1)
	require.Len(t, list.Parked, 1)

	res, err := cli.RetryDead(ctx, b.pool, cli.DeadRetryOptions{All: true, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, q, res.Outbox[0].ID)
	require.Zero(t, res.OutboxReleased+res.InboxReleased, "a dry run releases nothing")
	res, err = cli.RetryDead(ctx, b.pool, cli.DeadRetryOptions{IDs: []string{strconv.FormatInt(q, 10)}})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.OutboxReleased)
	require.False(t, res.InboxChosen, "ids without a consumer are outbox rows only")

	var asked int64
	rep, err := cli.Replay(ctx, b.pool, cli.ReplayOptions{Filter: outbox.ReplayFilter{Since: time.Now().Add(-72 * time.Hour)},
		Confirm: func(p outbox.ReplayPlan) error { asked = p.Rows; return errors.New("no") }})
	require.EqualError(t, err, "no")
	require.EqualValues(t, 1, asked)
	require.EqualValues(t, 1, rep.Plan.Rows)
	require.Zero(t, rep.Marked, "refused: nothing marked")

	pr, err := cli.Purge(ctx, b.pool, nil, cli.PurgeOptions{OlderThan: 20 * 24 * time.Hour})
	require.NoError(t, err)
	require.True(t, pr.OutboxPurged && pr.InboxPurged)
	require.Zero(t, pr.OutboxDeleted, "nothing is that old")
	pr, err = cli.Purge(ctx, b.pool, nil, cli.PurgeOptions{OlderThan: time.Hour, OutboxOnly: true})
	require.NoError(t, err)
	require.EqualValues(t, 1, pr.OutboxDeleted)
	require.False(t, pr.InboxPurged)
	require.Empty(t, pr.Warning)
	_, err = cli.Purge(ctx, b.pool, nil, cli.PurgeOptions{OlderThan: 24 * time.Hour, InboxOnly: true})
	require.ErrorIs(t, err, cli.ErrGuarantee, "an inbox retention under SQS's 14-day maximum is refused")
	pr, err = cli.Purge(ctx, b.pool, nil, cli.PurgeOptions{OlderThan: 24 * time.Hour, InboxOnly: true, AllowDuplicateApplies: true})
	require.NoError(t, err)
	require.Contains(t, pr.Warning, "SQS's 14-day maximum retention", "an accepted short inbox retention is called out")

	conn, err := pgx.Connect(ctx, b.url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	st, err := cli.ReadMigrations(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), st.Current)
	require.Len(t, st.Migrations, int(migrations.Latest()))
	up, err := cli.MigrateUp(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, cli.MigrateResult{From: migrations.Latest(), To: migrations.Latest()}, up)
}
