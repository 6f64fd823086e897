package outbox_test

// Issue 44, the WAL wake-up: the stream makes committed rows' keys due, polling takes over at
// once whenever the stream cannot be followed, and the claim stays the truth. Each test runs
// against a real server with wal_level=logical (its own throwaway cluster) or without it (the
// shared one).

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// logicalPool returns a pool on a fresh, migrated database of its own on the throwaway cluster
// with wal_level=logical (testdb.LogicalURL): each test's relays see only its own outbox.
func logicalPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testdb.LogicalURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// walRelay starts Run on pool with the WAL wake-up and a poll interval of an hour: after the
// start, only the stream can make a new row's key due (or a sweep, an hour apart too).
func walRelay(t *testing.T, pool *pgxpool.Pool, rec *recorder, poll time.Duration, mutate ...func(*outbox.RelayConfig)) *outbox.Relay {
	t.Helper()
	cfg := outbox.RelayConfig{Publisher: rec, Topics: map[string]string{testTopic: testARN},
		PollInterval: poll, RescanInterval: time.Hour, Lease: 30 * time.Second, PublishTimeout: 5 * time.Second,
		WAL: &outbox.WALWake{RetryAfter: 200 * time.Millisecond}, Logger: testLogger()}
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := outbox.NewRelay(pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// The stream wakes the relay: with polls an hour apart, rows committed after the start are
// published, each key's in order — including a row whose id was taken before another's but
// that committed after it (a late commit below what a poll would have seen).
func TestWALWakeUpPublishesWhatCommitted(t *testing.T) {
	t.Parallel()
	pool := logicalPool(t)
	b := &bundle{pool: pool, rec: newRecorder()}
	r := walRelay(t, pool, b.rec, time.Hour)
	testwait.Until(t, "the relay follows the WAL", r.FollowingWAL)

	late, commitLate := b.lateRow(t, "late-key", testTopic)
	written := b.write(t, 30, 3)
	commitLate()
	written = append(written, late)
	testwait.Until(t, "every row committed after the start is published", func() bool {
		for _, m := range written {
			if !b.rec.published(m.EventID) {
				return false
			}
		}
		return true
	})
	b.rec.requireKeyOrder(t)
	require.True(t, r.FollowingWAL(), "still following")
}

// A slot that ends (its walsender terminated, as at a failover) costs latency only: the relay
// polls at once, publishes what committed meanwhile, and follows a new slot again.
func TestWALWakeUpFallsBackAndReturns(t *testing.T) {
	t.Parallel()
	pool := logicalPool(t)
	b := &bundle{pool: pool, rec: newRecorder()}
	r := walRelay(t, pool, b.rec, 50*time.Millisecond)
	testwait.Until(t, "the relay follows the WAL", r.FollowingWAL)

	ctx := context.Background()
	var ended int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE backend_type = 'walsender' AND datname = current_database()`).Scan(&ended))
	require.Positive(t, ended, "a walsender of the relay was ended")
	written := b.write(t, 10, 2)
	testwait.Until(t, "rows committed while the stream was down are published", func() bool {
		for _, m := range written {
			if !b.rec.published(m.EventID) {
				return false
			}
		}
		return true
	})
	testwait.Until(t, "the relay follows the WAL again", r.FollowingWAL)
	var slots int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sluice_relay_%' AND NOT temporary`).Scan(&slots))
	require.Zero(t, slots, "the relay's slots are temporary: none outlives its session")
	b.rec.requireKeyOrder(t)
}

// Where the stream cannot work (wal_level=replica, as on the shared test server), the relay
// says so and polls: rows are published as without the option.
func TestWALWakeUpUnavailablePolls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var level string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SHOW wal_level").Scan(&level))
	if level == "logical" {
		t.Skip("the shared server decodes WAL; this test needs one that does not") // TEST_DATABASE_URL pointing at a logical server
	}
	r := walRelay(t, b.pool, b.rec, 50*time.Millisecond)
	written := b.write(t, 10, 2)
	testwait.Until(t, "rows published by polling", func() bool {
		for _, m := range written {
			if !b.rec.published(m.EventID) {
				return false
			}
		}
		return true
	})
	require.False(t, r.FollowingWAL(), "no stream on a server without wal_level=logical")
}

// The publication the wake-up creates carries only inserts and never the payload.
func TestWALWakeUpPublicationCarriesNoPayload(t *testing.T) {
	t.Parallel()
	pool := logicalPool(t)
	b := &bundle{pool: pool, rec: newRecorder()}
	r := walRelay(t, pool, b.rec, time.Hour)
	testwait.Until(t, "the relay follows the WAL", r.FollowingWAL)
	var cols []string
	var ins, upd bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT p.attnames, pub.pubinsert, pub.pubupdate
		FROM pg_publication_tables p JOIN pg_publication pub USING (pubname) WHERE pubname = 'sluice_outbox'`).Scan(&cols, &ins, &upd))
	require.ElementsMatch(t, []string{"id", "topic", "partition_key"}, cols)
	require.True(t, ins)
	require.False(t, upd)
}

// An idle outbox costs a relay that follows the WAL no statements: once a sweep found nothing
// to move and the stream reported nothing for a while before it, the stream stands in for the
// polls and the sweeps (here 20 ms and 50 ms apart), until its next change, which is
// published as ever.
func TestWALWakeUpIdleCostsNoStatements(t *testing.T) {
	t.Parallel()
	url := testdb.LogicalURL(t)
	var statements atomic.Int64
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = statementCounter{&statements}
	relayPool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)
	writer, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(writer.Close)
	b := &bundle{pool: writer, rec: newRecorder()}
	r := walRelay(t, relayPool, b.rec, 20*time.Millisecond, func(c *outbox.RelayConfig) { c.RescanInterval = 50 * time.Millisecond })
	testwait.Until(t, "the relay follows the WAL", r.FollowingWAL)

	quiet := func() {
		testwait.Until(t, "two seconds without a statement from the relay", func() bool {
			before := statements.Load()
			time.Sleep(2 * time.Second)
			return statements.Load() == before
		})
	}
	published := func(written []outbox.Message) func() bool {
		return func() bool {
			for _, m := range written {
				if !b.rec.published(m.EventID) {
					return false
				}
			}
			return true
		}
	}
	written := b.write(t, 10, 3)
	testwait.Until(t, "rows published", published(written))
	quiet()
	written = b.write(t, 5, 2)
	testwait.Until(t, "rows committed while the relay was quiet are published", published(written))
	quiet()
	require.True(t, r.FollowingWAL())
	b.rec.requireKeyOrder(t)
}

// statementCounter counts the statements and batches sent on a pool's connections.
type statementCounter struct{ n *atomic.Int64 }

func (c statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// An operator action reaches a relay that follows the WAL through the stream, not a poll:
// with polls and sweeps an hour apart, a quarantined row released by RetryAllQuarantined is
// published.
func TestWALWakeUpCarriesOperatorActions(t *testing.T) {
	t.Parallel()
	pool := logicalPool(t)
	b := &bundle{pool: pool, rec: newRecorder()}
	b.rec.setFail(func(*outbox.Event) error { return outbox.Permanent(errors.New("refused until released")) })
	r := walRelay(t, pool, b.rec, time.Hour)
	testwait.Until(t, "the relay follows the WAL", r.FollowingWAL)

	written := b.write(t, 1, 1)
	testwait.Until(t, "the row is quarantined", func() bool {
		return b.countWhere(t, "quarantined_at IS NOT NULL") == 1
	})
	b.rec.setFail(nil)
	n, err := outbox.RetryAllQuarantined(context.Background(), pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	testwait.Until(t, "the released row is published", func() bool { return b.rec.published(written[0].EventID) })
}
