package fleet

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
)

// TestTheActivityPollReadsOnlyItsTenantsDatabases: a server holds the databases of this
// shard's tenants and others (another shard's tenants, written and with a session open). The
// activity poll's statement reads the statistics and sessions of its own tenants' databases
// only, and still sees their writes.
func TestTheActivityPollReadsOnlyItsTenantsDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type db struct {
		name string
		url  string
		pool *pgxpool.Pool
	}
	open := func() db {
		url := testdb.URL(t)
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		var name string
		require.NoError(t, pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name))
		return db{name: name, url: url, pool: pool}
	}
	write := func(d db) {
		t.Helper()
		_, err := d.pool.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			VALUES (gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k', '{}')`)
		require.NoError(t, err)
	}
	mine1, mine2, other := open(), open(), open()
	write(other) // another shard's database, written, with its pool's session open
	_, err := other.pool.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)

	f, err := New(Config{Registry: Static{}})
	require.NoError(t, err)
	s := newServer(f, "test")
	var all []*tenant
	for i, d := range []db{mine1, mine2} {
		tn := newTenant(f, Tenant{Name: []string{"t1", "t2"}[i], DatabaseURL: d.url, Server: "test"}, s)
		tn.database = d.name
		s.add(tn)
		all = append(all, tn)
	}
	t.Cleanup(func() { s.closeConn(context.Background()) })
	_, _, dbs := s.membersPolled()
	require.ElementsMatch(t, []string{mine1.name, mine2.name}, dbs)

	seen, err := s.activity(ctx, all, dbs)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{mine1.name, mine2.name}, slices.Collect(maps.Keys(seen)),
		"the poll read its tenants' databases and no other of the server's")

	before := seen[mine1.name].inserted
	write(mine1)
	testwait.Until(t, "the poll counting the write in its tenant's database", func() bool {
		seen, err := s.activity(ctx, all, dbs)
		require.NoError(t, err)
		require.NotContains(t, seen, other.name)
		return seen[mine1.name].inserted > before
	})
}
