package audit_test

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/audit"
	"github.com/sluicehq/sluice/internal/testdb"
)

// events is how many published events the two-database test audits; BENCHMARKS.md's audit row
// comes from -audit.events=1000000.
var events = flag.Int("audit.events", 20_000, "published events in the two-database audit test")

func TestMain(m *testing.M) { testdb.Main(m) }

// t0 is where the fixtures' event times start: a fixed instant, so the window is exact.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// published writes n published OrderCreated events into the outbox, created a millisecond apart
// from t0 and published 40 ms after their creation, and returns their ids and creation times.
func published(t *testing.T, db *pgxpool.Pool, n int) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO outbox_event
		(event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o-' || g, 'OrderCreated', 'o-' || g, '{}',
		       $1::timestamptz + g * interval '1 millisecond', $1::timestamptz + g * interval '1 millisecond' + interval '40 milliseconds'
		FROM generate_series(1, $2::int) g`, t0, n)
	require.NoError(t, err)
}

// applyAll records every published outbox event as applied by consumer in the inbox database,
// the way the inbox does: message id = event id, created_at = the createdAt attribute.
func applyAll(t *testing.T, outboxDB, inboxDB *pgxpool.Pool, consumer string) {
	t.Helper()
	ctx := context.Background()
	rows, err := outboxDB.Query(ctx, `SELECT event_id::text, event_type, created_at FROM outbox_event WHERE published_at IS NOT NULL`)
	require.NoError(t, err)
	type ev struct {
		id, typ string
		at      time.Time
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ev, error) {
		var e ev
		return e, r.Scan(&e.id, &e.typ, &e.at)
	})
	require.NoError(t, err)
	n, err := inboxDB.CopyFrom(ctx, pgx.Identifier{"inbox_event"},
		[]string{"consumer", "message_id", "event_type", "created_at", "received_at", "processed_at"},
		pgx.CopyFromSlice(len(list), func(i int) ([]any, error) {
			e := list[i]
			return []any{consumer, e.id, e.typ, e.at, e.at.Add(50 * time.Millisecond), e.at.Add(60 * time.Millisecond)}, nil
		}))
	require.NoError(t, err)
	require.EqualValues(t, len(list), n)
}

func oneID(t *testing.T, db *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	var id string
	require.NoError(t, db.QueryRow(context.Background(), sql, args...).Scan(&id))
	return id
}

// TestAuditFindsExactlyWhatWasRemovedAcrossTwoDatabases is the proof: an inbox row deleted
// behind the consumer's back, a published message that never reached the queue, a parked
// message, an applied event the outbox never published and one still in flight; the audit names
// each, and nothing else, with the outbox and the inbox in different databases.
func TestAuditFindsExactlyWhatWasRemovedAcrossTwoDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	outboxDB, inboxDB := testdb.Pool(t), testdb.Pool(t)
	published(t, outboxDB, *events)
	applyAll(t, outboxDB, inboxDB, "billing")
	applyAll(t, outboxDB, inboxDB, "shipping") // another consumer in the same inbox: not audited

	// Deleted behind the consumer's back.
	deleted := oneID(t, inboxDB, `DELETE FROM inbox_event WHERE consumer = 'billing'
		AND message_id = (SELECT message_id FROM inbox_event WHERE consumer = 'billing' ORDER BY message_id OFFSET 7 LIMIT 1) RETURNING message_id`)
	// Published, but the message never reached the queue: the relay's row, no inbox row.
	dropped := oneID(t, outboxDB, `INSERT INTO outbox_event
		(event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		VALUES (gen_random_uuid(), 'orders', 'order', 'o-x', 'OrderCreated', 'o-x', '{}', $1, $1) RETURNING event_id::text`,
		t0.Add(time.Second))
	// Received, failed for good: parked, so not applied.
	parked := oneID(t, inboxDB, `UPDATE inbox_event SET processed_at = NULL, parked_at = now(), last_error = 'boom'
		WHERE consumer = 'billing' AND message_id = (SELECT message_id FROM inbox_event WHERE consumer = 'billing'
		ORDER BY message_id DESC LIMIT 1) RETURNING message_id`)
	// Applied, never published by this outbox.
	stranger := oneID(t, inboxDB, `INSERT INTO inbox_event (consumer, message_id, event_type, created_at, processed_at)
		VALUES ('billing', gen_random_uuid()::text, 'OrderCreated', $1, $1) RETURNING message_id`, t0.Add(2*time.Second))
	// Published a moment ago: in flight, not yet missing.
	now := t0.Add(time.Hour)
	inFlight := oneID(t, outboxDB, `INSERT INTO outbox_event
		(event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		VALUES (gen_random_uuid(), 'orders', 'order', 'o-y', 'OrderCreated', 'o-y', '{}', $1, $1) RETURNING event_id::text`,
		now.Add(-time.Minute))
	// Outside the window and of another type: not audited.
	_, err := outboxDB.Exec(ctx, `INSERT INTO outbox_event
		(event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		VALUES (gen_random_uuid(), 'orders', 'order', 'o-z', 'OrderCreated', 'o-z', '{}', $1, $1),
		       (gen_random_uuid(), 'orders', 'order', 'o-w', 'OrderShipped', 'o-w', '{}', $2, $2)`,
		t0.Add(-time.Hour), t0.Add(time.Second))
	require.NoError(t, err)

	r, err := audit.Run(ctx, outboxDB, inboxDB, audit.Options{
		Consumer: "billing", Since: t0, Until: now, Now: func() time.Time { return now },
	})
	require.NoError(t, err)
	require.Equal(t, []string{"OrderCreated"}, r.EventTypes)
	require.True(t, r.EventTypesInferred)

	got := map[string]audit.Gap{}
	for _, g := range r.Missing {
		got[g.EventID] = g
	}
	require.Len(t, r.Missing, 4, "%+v", r.Missing)
	require.Equal(t, "absent", got[deleted].InboxState)
	require.True(t, got[deleted].Overdue)
	require.Equal(t, "absent", got[dropped].InboxState)
	require.True(t, got[dropped].Overdue)
	require.Equal(t, "parked", got[parked].InboxState)
	require.Equal(t, "absent", got[inFlight].InboxState)
	require.False(t, got[inFlight].Overdue, "published a minute ago: in flight")
	require.Equal(t, "OrderCreated", got[deleted].EventType)
	require.Equal(t, 3, r.Overdue())
	require.Equal(t, []string{stranger}, r.Unpublished)

	require.EqualValues(t, *events+2, r.Cost.OutboxEvents)
	require.EqualValues(t, *events-1, r.Cost.InboxEvents) // one deleted, one parked, one stranger
	require.Less(t, r.Cost.IDsRead, 4*audit.DefaultLeafSize*2, "only the differing buckets are read id by id")
	require.Equal(t, 60*time.Millisecond, r.Lag.P50)
	t.Logf("audited %d published events: %d queries, %d buckets, %d rows grouped, %d ids read, %d levels, %s",
		r.Cost.OutboxEvents, r.Cost.Queries, r.Cost.BucketsRead, r.Cost.RowsGrouped, r.Cost.IDsRead, r.Cost.Levels, r.Cost.Duration)
}

// TestAuditOfAConsumerThatAppliedEverythingReadsNoIDs: equal sides cost one summary per side.
func TestAuditOfAConsumerThatAppliedEverythingReadsNoIDs(t *testing.T) {
	t.Parallel()
	db := testdb.Pool(t) // outbox and inbox in one database
	published(t, db, 3000)
	applyAll(t, db, db, "billing")
	r, err := audit.Run(context.Background(), db, db, audit.Options{
		Consumer: "billing", Since: t0, Until: t0.Add(time.Hour), EventTypes: []string{"OrderCreated"},
	})
	require.NoError(t, err)
	require.Empty(t, r.Missing)
	require.Empty(t, r.Unpublished)
	require.Zero(t, r.Cost.IDsRead)
	require.Equal(t, 1, r.Cost.Levels)
	require.EqualValues(t, 3000, r.Cost.OutboxEvents)
	require.EqualValues(t, 3000, r.Cost.InboxEvents)
}

func TestAuditRefusesBadOptions(t *testing.T) {
	t.Parallel()
	db := testdb.Pool(t)
	_, err := audit.Run(context.Background(), db, db, audit.Options{Since: t0.Add(time.Hour), Until: t0, LeafSize: -1})
	require.ErrorIs(t, err, audit.ErrInvalidOptions)
	require.ErrorContains(t, err, "a consumer is required")
	require.ErrorContains(t, err, "the window is empty")
	require.ErrorContains(t, err, "leaf size")
}
