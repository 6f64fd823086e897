package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

// Converting is explicit: without --yes the command prints the plan, exits non-zero and
// changes nothing; with --yes the table is partitioned and keeps every row.
func TestPartitionConvertPrintsThePlanAndRefusesWithoutYes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		b.insertOutbox(t, outboxRow{})
	}
	b.insertInbox(t, "billing", "m-1", "processed", time.Hour)
	before := b.fingerprint(t)

	r := b.run(t, "partition", "convert", "outbox")
	require.Equal(t, cli.ExitError, r.code)
	require.Contains(t, r.err, "refusing to convert outbox_event (not confirmed): stdin is not a terminal; pass --yes")
	require.Contains(t, r.out, "Converting outbox_event to a partitioned table:")
	require.Contains(t, r.out, "1. add CHECK (id < ")
	require.Contains(t, r.out, "note: unique index outbox_event_event_id_key stays on outbox_event_p0 only")
	require.Equal(t, before, b.fingerprint(t))
	require.Contains(t, b.ok(t, "partition", "status"), "outbox_event: plain table")

	out := b.ok(t, "partition", "convert", "outbox", "--size", "1000", "--yes")
	require.Contains(t, out, "done: outbox_event is partitioned by RANGE (id)")
	out = b.ok(t, "partition", "convert", "inbox", "--interval", "7d", "--yes")
	require.Contains(t, out, "done: inbox_event is partitioned by RANGE (received_at)")
	require.Equal(t, before, b.fingerprint(t), "every row kept, unchanged")

	var st cli.PartitionStatus
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "partition", "status", "--json")), &st))
	require.True(t, st.Outbox.Partitioned)
	require.True(t, st.Inbox.Partitioned)
	require.Len(t, st.Outbox.Partitions, 4, "the former table, 2 ahead, the default one")
	require.Equal(t, "outbox_event_p0", st.Outbox.Partitions[0].Name)
	require.True(t, st.Outbox.Partitions[3].Default)
	out = b.ok(t, "partition", "status")
	require.Contains(t, out, "outbox_event: partitioned, 4 partitions")
	require.Contains(t, out, "inbox_event_default")

	r = b.run(t, "partition", "convert", "outbox", "--yes")
	require.Equal(t, cli.ExitError, r.code)
	require.Contains(t, r.err, "already partitioned")
}

// Bad options are usage errors (exit 2) that change nothing.
func TestPartitionCommandsRefuseBadUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, args := range [][]string{
		{"partition", "convert"},
		{"partition", "convert", "orders"},
		{"partition", "convert", "inbox", "--size", "10"},
		{"partition", "maintain", "--outbox-only", "--inbox-only"},
		{"partition", "maintain", "--older-than", "soon"},
	} {
		r := b.run(t, args...)
		require.Equal(t, cli.ExitUsage, r.code, "%v: %s", args, r.err)
	}
	_, err := cli.ConvertPartitioned(context.Background(), b.pool, cli.PartitionConvertOptions{Table: "outbox"})
	require.True(t, errors.Is(err, cli.ErrNotConfirmed))
	require.Contains(t, b.ok(t, "partition", "status"), "outbox_event: plain table")
}

// maintain creates partitions ahead and drops the outbox partitions that expired; purge does the
// same on a partitioned table, and deletes expired rows of the default partition.
func TestPartitionMaintainAndPurgeDropExpiredPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ok(t, "partition", "convert", "outbox", "--size", "2", "--ahead", "1", "--yes") // [MINVALUE, 2), [2, 4), default
	for range 5 {
		b.insertOutbox(t, outboxRow{age: 50 * 24 * time.Hour, publishedAgo: ago(40 * 24 * time.Hour)})
	}
	out := b.ok(t, "partition", "maintain", "--outbox-only", "--size", "2", "--ahead", "3")
	require.Contains(t, out, "outbox_event: created outbox_event_p")
	out = b.ok(t, "partition", "maintain", "--outbox-only", "--older-than", "30d", "--size", "2", "--ahead", "3", "--yes")
	require.Contains(t, out, "outbox_event: dropped outbox_event_p0 [MINVALUE, 2)")
	require.Contains(t, out, "outbox_event: dropped outbox_event_p0000000000000000002 [2, 4)")
	require.Contains(t, out, "deleted 2 expired rows from the default partition", "rows 4 and 5 went to the default partition")

	b.insertOutbox(t, outboxRow{age: 50 * 24 * time.Hour, publishedAgo: ago(40 * 24 * time.Hour)}) // row 6
	b.insertOutbox(t, outboxRow{})                                                                 // row 7: unpublished
	res, err := cli.Purge(context.Background(), b.pool, nil, cli.PurgeOptions{OlderThan: 30 * 24 * time.Hour, OutboxOnly: true})
	require.NoError(t, err)
	require.True(t, res.OutboxPurged)
	var left int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_event`).Scan(&left))
	require.Equal(t, 1, left, "only the unpublished row is left")
}

// On plain tables maintenance has nothing to do: with --older-than, and without a terminal or
// --yes (a cron job), it says so once and succeeds.
func TestPartitionMaintainOnPlainTablesSaysNothingToDoOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertOutbox(t, outboxRow{age: 40 * 24 * time.Hour, publishedAgo: ago(40 * 24 * time.Hour)})
	before := b.fingerprint(t)
	for _, args := range [][]string{
		{"partition", "maintain", "--older-than", "30d"},
		{"partition", "maintain", "--older-than", "30d", "--yes"},
	} {
		r := b.run(t, args...)
		require.Equal(t, cli.ExitOK, r.code, "%v: %s", args, r.err)
		require.Equal(t, 1, strings.Count(r.out, "outbox_event: plain table, nothing to do"), "%v: %s", args, r.out)
		require.Equal(t, 1, strings.Count(r.out, "inbox_event: plain table, nothing to do"), "%v: %s", args, r.out)
	}
	lines := jsonLines(t, b.ok(t, "partition", "maintain", "--older-than", "30d", "--json"))
	require.Len(t, lines, 1, "one result line, no plan awaiting a confirmation: %v", lines)
	require.Equal(t, "result", lines[0]["event"])
	require.Equal(t, before, b.fingerprint(t))
}
