package cli_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/testdb"
)

// TestAuditAcrossTwoDatabases: the outbox in one database, the consumer's inbox in another. A
// deleted inbox row makes `sluice audit` exit 1 and name it; restoring it makes the audit pass.
func TestAuditAcrossTwoDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	inboxURL := testdb.URL(t)
	inbox, err := pgxpool.New(ctx, inboxURL)
	require.NoError(t, err)
	t.Cleanup(inbox.Close)

	_, err = b.pool.Exec(ctx, `INSERT INTO outbox_event
		(event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o-' || g, 'OrderCreated', 'o-' || g, '{}',
		       now() - interval '2 hours' + g * interval '1 second', now() - interval '2 hours' + g * interval '1 second'
		FROM generate_series(1, 600) g`)
	require.NoError(t, err)
	rows, err := b.pool.Query(ctx, `SELECT event_id::text, created_at FROM outbox_event`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var at any
		require.NoError(t, rows.Scan(&id, &at))
		_, err := inbox.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, created_at, processed_at)
			VALUES ('billing', $1, 'OrderCreated', $2, now())`, id, at)
		require.NoError(t, err)
	}
	require.NoError(t, rows.Err())
	var deleted string
	require.NoError(t, inbox.QueryRow(ctx, `DELETE FROM inbox_event WHERE message_id = (SELECT min(message_id) FROM inbox_event) RETURNING message_id`).Scan(&deleted))

	r := b.run(t, "audit", "--consumer", "billing", "--since", "3h", "--inbox-database-url", inboxURL, "--json")
	require.Equal(t, 1, r.code, r.err)
	require.Contains(t, r.err, "billing is missing 1 published events")
	var docs []cli.AuditDocument
	require.NoError(t, json.Unmarshal([]byte(r.out), &docs), r.out)
	require.Len(t, docs, 1)
	require.EqualValues(t, 600, docs[0].Published)
	require.EqualValues(t, 599, docs[0].Applied)
	require.Len(t, docs[0].Missing, 1)
	require.Equal(t, deleted, docs[0].Missing[0].EventID)
	require.Equal(t, "absent", docs[0].Missing[0].Inbox)
	require.Empty(t, docs[0].Unpublished)

	// The environment names the inbox's database as well as the flag does; the text report names the gap.
	b.env[cli.EnvInboxDatabaseURL] = inboxURL
	r = b.run(t, "audit", "--since", "3h")
	require.Equal(t, 1, r.code, r.err)
	require.Contains(t, r.out, "consumer billing:")
	require.Contains(t, r.out, deleted)

	// The consumer applies it (a redrive, or `sluice dead retry`): the audit passes.
	_, err = inbox.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, created_at, processed_at)
		VALUES ('billing', $1, 'OrderCreated', $2, now())`, deleted, outboxCreatedAt(t, b.pool, deleted))
	require.NoError(t, err)
	r = b.run(t, "audit", "--consumer", "billing", "--since", "3h")
	require.Equal(t, 0, r.code, r.err+r.out)
	require.Contains(t, r.out, "missing 0")

	// Bad input changes nothing and says what is wrong.
	r = b.run(t, "audit", "--consumer", "billing")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.err, "--since is required")
	r = b.run(t, "audit", "--consumer", "billing", "--since", "1h", "--until", "-2h")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.err, "the window is empty")
}

func outboxCreatedAt(t *testing.T, db *pgxpool.Pool, id string) any {
	t.Helper()
	var at any
	require.NoError(t, db.QueryRow(context.Background(), `SELECT created_at FROM outbox_event WHERE event_id = $1::uuid`, id).Scan(&at))
	return at
}
