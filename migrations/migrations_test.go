package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/partition"
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

// 0005 turns the payload columns into json: existing rows keep jsonb's text of their payload
// (what the relay published), new rows keep the bytes written, and down returns to jsonb.
func TestPayloadJSONMigrationKeepsExistingTextAndNewBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.EmptyURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, migrations.To(ctx, conn, 4))

	const written = `{"z": 2,  "a":1.50e1}`
	_, err = conn.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES (gen_random_uuid(), 't', '', 'a', 'E', 'old', $1::text::jsonb)`, written)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, payload) VALUES ('c', 'old', 'E', $1::text::jsonb), ('c', 'none', 'E', NULL)`, written)
	require.NoError(t, err)
	var jsonbText string
	require.NoError(t, conn.QueryRow(ctx, `SELECT payload::text FROM outbox_event`).Scan(&jsonbText))
	require.Equal(t, `{"a": 15.0, "z": 2}`, jsonbText)

	require.NoError(t, migrations.To(ctx, conn, 5))
	for _, table := range []string{"outbox_event", "inbox_event"} {
		var typ string
		require.NoError(t, conn.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'payload'`, table).Scan(&typ))
		require.Equal(t, "json", typ, table)
	}
	var out, in string
	var none *string
	require.NoError(t, conn.QueryRow(ctx, `SELECT payload::text FROM outbox_event WHERE partition_key = 'old'`).Scan(&out))
	require.NoError(t, conn.QueryRow(ctx, `SELECT payload::text FROM inbox_event WHERE message_id = 'old'`).Scan(&in))
	require.NoError(t, conn.QueryRow(ctx, `SELECT payload::text FROM inbox_event WHERE message_id = 'none'`).Scan(&none))
	require.Equal(t, jsonbText, out, "an existing row keeps the text it would have been published as")
	require.Equal(t, jsonbText, in)
	require.Nil(t, none, "inbox payloads stay nullable")

	_, err = conn.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES (gen_random_uuid(), 't', '', 'a', 'E', 'new', $1)`, written)
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, `SELECT payload::text FROM outbox_event WHERE partition_key = 'new'`).Scan(&out))
	require.Equal(t, written, out, "a new row keeps the bytes written")

	require.NoError(t, migrations.To(ctx, conn, 4))
	var typ string
	require.NoError(t, conn.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'outbox_event'::regclass AND attname = 'payload'`).Scan(&typ))
	require.Equal(t, "jsonb", typ)
	require.NoError(t, conn.QueryRow(ctx, `SELECT payload::text FROM outbox_event WHERE partition_key = 'new'`).Scan(&out))
	require.Equal(t, jsonbText, out, "down stores jsonb again")
}

// Tables converted with `sluice partition` before 0005 are altered through their parents: every
// partition gets json, and partitions created afterwards copy it.
func TestPayloadJSONMigrationReachesEveryPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.EmptyURL(t)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, migrations.To(ctx, conn, 4))
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()

	_, err = conn.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 't', '', 'a', 'E', 'k', jsonb_build_object('i', i) FROM generate_series(1, 50) i`)
	require.NoError(t, err)
	_, err = partition.Convert(ctx, pool, partition.Outbox, &partition.Options{Size: 100, Ahead: 2}, nil)
	require.NoError(t, err)
	_, err = partition.Convert(ctx, pool, partition.Inbox, &partition.Options{}, nil)
	require.NoError(t, err)

	require.NoError(t, migrations.To(ctx, conn, 5))
	_, err = conn.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 't', '', 'a', 'E', 'k', ' [ 1 ] ' FROM generate_series(1, 350) i`)
	require.NoError(t, err)
	_, err = partition.Maintain(ctx, pool, partition.Outbox, &partition.Options{Size: 100, Ahead: 4})
	require.NoError(t, err)
	_, err = partition.Maintain(ctx, pool, partition.Inbox, &partition.Options{Ahead: 4})
	require.NoError(t, err)

	rows, err := conn.Query(ctx, `SELECT c.relname, format_type(a.atttypid, a.atttypmod)
		FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'payload'
		WHERE c.relname LIKE 'outbox\_event%' OR c.relname LIKE 'inbox\_event%'`)
	require.NoError(t, err)
	types, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var v [2]string
		return v, r.Scan(&v[0], &v[1])
	})
	require.NoError(t, err)
	require.Greater(t, len(types), 8, "parents, former tables, new and default partitions: %v", types)
	for _, v := range types {
		require.Equal(t, "json", v[1], v[0])
	}
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE payload::text = ' [ 1 ] '`).Scan(&n))
	require.Equal(t, 350, n)
}
