package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestChainOfSaysWhyEachRowWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 6, 2) // k0: ids 1, 3, 5; k1: ids 2, 4, 6

	c, err := outbox.ChainOf(ctx, b.pool, "k0", 0)
	require.NoError(t, err)
	require.Equal(t, int64(3), c.Pending)
	require.Len(t, c.Rows, 3)
	require.Equal(t, []int64{1, 3, 5}, []int64{c.Rows[0].ID, c.Rows[1].ID, c.Rows[2].ID}, "the chain is in publishing order")
	require.Equal(t, outbox.WaitReady, c.Rows[0].Wait, "nothing holds the head back")
	require.Equal(t, outbox.WaitBehind, c.Rows[1].Wait)
	require.Equal(t, int64(1), c.Rows[1].BehindID)
	require.Nil(t, c.HeldBy)

	// Quarantined head, with its reason.
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET quarantined_at = now(), attempts = 5, last_error = 'payload rejected' WHERE id = 1`)
	require.NoError(t, err)
	c, err = outbox.ChainOf(ctx, b.pool, "k0", 2)
	require.NoError(t, err)
	require.Len(t, c.Rows, 2, "the limit bounds the rows read")
	require.Equal(t, int64(3), c.Pending, "the count covers the whole key")
	require.Equal(t, outbox.WaitQuarantined, c.Rows[0].Wait)
	require.Equal(t, "payload rejected", c.Rows[0].LastError)

	// Backoff until available_at.
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET available_at = now() + interval '1 hour', attempts = 1,
		failing_since = now(), last_error = 'throttled' WHERE id = 2`)
	require.NoError(t, err)
	c, err = outbox.ChainOf(ctx, b.pool, "k1", 0)
	require.NoError(t, err)
	require.Equal(t, outbox.WaitBackoff, c.Rows[0].Wait)
	require.True(t, c.Rows[0].AvailableAt.After(c.Now))

	// A failing destination: failed without an attempt counted.
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET available_at = NULL, attempts = 0 WHERE id = 2`)
	require.NoError(t, err)
	c, err = outbox.ChainOf(ctx, b.pool, "k1", 0)
	require.NoError(t, err)
	require.Equal(t, outbox.WaitOutage, c.Rows[0].Wait)

	// Held by another session's advisory lock, taken as a relay takes it.
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET failing_since = NULL, last_error = NULL WHERE id = 2`)
	require.NoError(t, err)
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET application_name = 'relay-under-test'`)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	var locked []string
	rows, err := conn.Query(ctx, outbox.LockKeysSQL, []string{"k1"})
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		locked = append(locked, k)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"k1"}, locked)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock_all()`) }()

	c, err = outbox.ChainOf(ctx, b.pool, "k1", 0)
	require.NoError(t, err)
	require.Equal(t, outbox.WaitHeld, c.Rows[0].Wait)
	require.NotNil(t, c.HeldBy)
	require.Equal(t, pid, c.HeldBy.PID)
	require.Equal(t, "relay-under-test", c.HeldBy.ApplicationName)

	other, err := outbox.ChainOf(ctx, b.pool, "k0", 0)
	require.NoError(t, err)
	require.Nil(t, other.HeldBy, "another key's lock is not this key's")

	none, err := outbox.ChainOf(ctx, b.pool, "no-such-key", 0)
	require.NoError(t, err)
	require.Empty(t, none.Rows)
	require.Zero(t, none.Pending)
}

func TestDestinationsOfReportsEachTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 4, 2) // topic orders, k0: 1, 3; k1: 2, 4
	_, err := b.pool.Exec(ctx, `
		UPDATE outbox_event SET topic = 'invoices' WHERE id = 4;
		UPDATE outbox_event SET quarantined_at = now(), last_error = 'too large' WHERE id = 1;
		UPDATE outbox_event SET failing_since = now() - interval '1 minute', attempts = 0, last_error = 'sns down' WHERE id = 2;
		UPDATE outbox_event SET created_at = now() - interval '2 minutes' WHERE id = 3`)
	require.NoError(t, err)
	// A topic with nothing pending that published in the last minute, and an older publication.
	b.write(t, 2, 2) // ids 5, 6
	_, err = b.pool.Exec(ctx, `
		UPDATE outbox_event SET topic = 'payments', published_at = now() WHERE id = 5;
		UPDATE outbox_event SET topic = 'payments', published_at = now() - interval '5 minutes' WHERE id = 6`)
	require.NoError(t, err)

	ds, err := outbox.DestinationsOf(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, ds, 3)
	inv, ord, pay := ds[0], ds[1], ds[2]
	require.Equal(t, outbox.DestinationLag{Topic: "payments", PublishedLastMinute: 1}, pay)
	require.Equal(t, "invoices", inv.Topic)
	require.Equal(t, int64(1), inv.Pending)
	require.Zero(t, inv.Failing)
	require.False(t, inv.Outage)

	require.Equal(t, "orders", ord.Topic)
	require.Equal(t, int64(2), ord.Pending)
	require.Equal(t, int64(1), ord.Quarantined)
	require.Equal(t, int64(1), ord.QuarantinedKeys)
	require.Equal(t, int64(1), ord.Failing)
	require.True(t, ord.Outage)
	require.Equal(t, "sns down", ord.LastError)
	require.NotNil(t, ord.FailingSince)
	require.InDelta(t, 120, ord.OldestPendingAge.Seconds(), 10)
}
