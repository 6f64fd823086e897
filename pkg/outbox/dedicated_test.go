package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// dedicatedSetup is setup with a pool of one connection made with DedicatePool for relays of
// the given lease (and bundle.relay's other settings).
func dedicatedSetup(t *testing.T, lease time.Duration) *bundle {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	pcfg.MaxConns = 1
	outbox.DedicatePool(pcfg, outbox.RelayConfig{Lease: lease})
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &bundle{pool: pool, rec: newRecorder()}
}

// sessionState reads, on the pool's connection, its backend, the settings a round needs and
// the advisory locks the session holds.
func sessionState(t *testing.T, pool *pgxpool.Pool) (pid uint32, timeout, seqscan, planCache string, locks int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT pg_backend_pid(), current_setting('statement_timeout'),
		current_setting('enable_seqscan'), current_setting('plan_cache_mode'),
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())`).
		Scan(&pid, &timeout, &seqscan, &planCache, &locks))
	return
}

// A dedicated pool's session keeps the round settings between rounds (they are not set and
// reset around each), a round still releases every key it locked, and per-key order holds.
func TestADedicatedPoolKeepsTheRoundSettingsAndReleasesEveryKey(t *testing.T) {
	t.Parallel()
	b := dedicatedSetup(t, 30*time.Second)
	r := b.relay(t) // bundle.relay's Lease is 30 s, the pool's
	b.write(t, 60, 6)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Equal(t, 60, b.rec.count())
	b.rec.requireKeyOrder(t)

	_, timeout, seqscan, planCache, locks := sessionState(t, b.pool)
	require.Equal(t, "15s", timeout, "half the lease, set when the connection opened")
	require.Equal(t, "off", seqscan)
	require.Equal(t, "force_generic_plan", planCache)
	require.Zero(t, locks, "a round leaves no key locked on its connection")

	// A relay of another lease on the same pool sets and resets its own settings around its
	// rounds: the connection has the server's defaults again, and the first relay, which
	// now sets and resets its settings around every round too, still publishes in order.
	other := b.relay(t, func(c *outbox.RelayConfig) { c.Lease = 10 * time.Second })
	b.write(t, 10, 2)
	drainUntil(t, other, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	_, timeout, _, _, locks = sessionState(t, b.pool)
	require.Equal(t, "0", timeout)
	require.Zero(t, locks)
	b.write(t, 10, 2)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Equal(t, 80, b.rec.count())
	b.rec.requireKeyOrder(t)
	_, timeout, _, _, locks = sessionState(t, b.pool)
	require.Equal(t, "0", timeout)
	require.Zero(t, locks)
}

// On PostgreSQL 14 and later a dedicated session left idle for the lease is closed by the
// server (idle_session_timeout: a frozen relay's connection does not stay open); the pool
// replaces it before a round uses it, and the relay goes on publishing.
func TestADedicatedConnectionClosedByTheServerIsReplaced(t *testing.T) {
	t.Parallel()
	// Short enough for the test, long enough that a busy machine's statements stay within
	// half of it (the session's statement_timeout).
	const lease = 3 * time.Second
	b := dedicatedSetup(t, lease)
	r := b.relay(t, func(c *outbox.RelayConfig) { c.Lease = lease })
	b.write(t, 5, 1)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	first, _, _, _, _ := sessionState(t, b.pool)

	var alive bool
	waitFor := time.Now().Add(time.Minute)
	for time.Now().Before(waitFor) {
		time.Sleep(3 * lease) // idle, then closed by the server
		require.NoError(t, testdb.Pool(t).QueryRow(context.Background(),
			`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, first).Scan(&alive))
		if !alive {
			break
		}
	}
	require.False(t, alive, "the server closes a dedicated session idle for the lease")

	b.write(t, 5, 1)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Equal(t, 10, b.rec.count())
	b.rec.requireKeyOrder(t)
	second, _, _, _, _ := sessionState(t, b.pool)
	require.NotEqual(t, first, second)
}
