package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
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

func TestRelayPublishesAndMarksEveryRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	written := b.write(t, 250, 10)
	r := b.relay(t)

	st, err := r.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 250, st.Published)
	require.Equal(t, 250, b.rec.count())
	require.Zero(t, b.countWhere(t, "published_at IS NULL"))
	require.Zero(t, b.countWhere(t, "available_at IS NOT NULL"), "published rows carry no backoff")
	b.rec.requireKeyOrder(t)

	got := map[string]bool{}
	for _, e := range b.rec.received {
		got[e.EventID.String()] = true
	}
	for _, w := range written {
		require.True(t, got[w.EventID.String()], "event %s published", w.EventID)
	}
}

func TestFourRelaysRacingKeepEveryKeyInOrderAndLoseNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 20000, 200)
	b.rec.delay = time.Millisecond // let calls overlap

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		r := b.relay(t, func(c *outbox.RelayConfig) { c.BatchSize = 300; c.MaxPerKey = 5; c.PublishConcurrency = 8 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b.countWhere(t, "published_at IS NULL") > 0 {
				if _, err := r.RunOnce(context.Background()); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, b.countWhere(t, "published_at IS NULL"), "every row published")
	b.rec.requireKeyOrder(t)
	unique := map[int64]bool{}
	for _, e := range b.rec.received {
		unique[e.ID] = true
	}
	require.Len(t, unique, 20000, "every row reached the broker")
	require.Len(t, b.rec.byKey, 200)
}

func TestRelayKilledBetweenPublishAndMarkRepublishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 40, 4)

	// The broker acknowledges, then the database goes away before the relay can record that:
	// connections are refused and every backend is terminated, as when the relay's host dies.
	admin, err := pgx.Connect(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	db := pgx.Identifier{b.pool.Config().ConnConfig.Database}.Sanitize()
	var killed atomic.Bool
	var killErr error
	b.rec.after = func() {
		if killed.CompareAndSwap(false, true) {
			if _, killErr = admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS false"); killErr != nil {
				return
			}
			_, killErr = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, b.pool.Config().ConnConfig.Database)
		}
	}
	r := b.relay(t, func(c *outbox.RelayConfig) { c.PublishConcurrency = 1 })
	_, err = r.RunOnce(ctx)
	require.NoError(t, killErr)
	require.Error(t, err, "recording the outcome fails on a dead connection")
	require.Positive(t, b.rec.count())

	// The database comes back; the next run republishes:
	// duplicates, never loss.
	_, err = admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true")
	require.NoError(t, err)
	require.Equal(t, 40, b.countWhere(t, "published_at IS NULL"), "nothing is marked published without a recorded acknowledgement")
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Greater(t, b.rec.count(), 40, "the acknowledged-but-unrecorded rows were published again")
	b.rec.requireKeyOrder(t)
}

func TestRelayCancelledMidPublishReleasesRowsForTheNextRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 30, 30)
	ctx, cancel := context.WithCancel(context.Background())
	b.rec.after = cancel // the relay stops right after the broker's first answer
	r := b.relay(t, func(c *outbox.RelayConfig) { c.PublishConcurrency = 1 })
	_, err := r.RunOnce(ctx)
	require.NoError(t, err, "stopping is not a failure")
	first := b.rec.count()
	require.Positive(t, first, "at least one call went out before the cancellation")
	require.Less(t, first, 30, "the cancellation stopped the relay before it published everything")
	require.Equal(t, first, 30-b.countWhere(t, "published_at IS NULL"), "what the broker acknowledged is recorded, nothing else")
	require.Zero(t, b.countWhere(t, "attempts > 0 OR last_error IS NOT NULL"), "a cancellation is not a failed attempt")

	b.rec.after = nil
	st, err := b.relay(t).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 30-first, st.Published, "released rows are claimable at once")
	require.Zero(t, b.countWhere(t, "published_at IS NULL"))
}

func TestPartialBatchFailureRetriesOnlyTheFailedEntries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	written := b.write(t, 20, 20) // 20 keys: two full batches
	flaky := map[string]int{written[3].EventID.String(): 2, written[12].EventID.String(): 1}
	var mu sync.Mutex
	b.rec.setFail(func(e *outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if flaky[e.EventID.String()] > 0 {
			flaky[e.EventID.String()]--
			return errors.New("Throttled")
		}
		return nil
	})
	// A backoff far longer than any RunOnce, however busy the machine: the failed rows wait.
	r := b.relay(t, func(c *outbox.RelayConfig) { c.BackoffBase, c.BackoffMax = time.Hour, time.Hour })
	st, err := r.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 18, st.Published, "acknowledged entries are marked at once")
	require.Equal(t, 2, st.Retrying)
	require.Equal(t, 2, b.countWhere(t, "published_at IS NULL AND attempts = 1 AND last_error LIKE '%Throttled%' AND available_at IS NOT NULL"))

	// The backoffs end (a fresh relay, which knows only what the table says, takes over).
	b.exec(t, `UPDATE outbox_event SET available_at = now() WHERE published_at IS NULL`)
	drainUntil(t, b.relay(t), func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Equal(t, 20, b.rec.count(), "each row acknowledged once")
	require.Zero(t, b.countWhere(t, "quarantined_at IS NOT NULL"))
}

func TestPoisonRowIsQuarantinedBlocksOnlyItsKeyAndCanBeRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	written := b.write(t, 30, 3) // keys k0,k1,k2 with 10 rows each
	poison := written[4]         // key k1, its second row
	require.Equal(t, "k1", poison.PartitionKey)
	b.rec.setFail(func(e *outbox.Event) error {
		if e.EventID == poison.EventID {
			return outbox.Permanent(errors.New("InvalidParameter: bad message"))
		}
		return nil
	})
	r := b.relay(t)
	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Quarantined)
	require.Equal(t, 21, st.Published, "k0, k2 and k1's first row flow")
	require.Equal(t, 1, b.countWhere(t, "quarantined_at IS NOT NULL AND last_error LIKE '%InvalidParameter%'"))
	require.Equal(t, 9, b.countWhere(t, "published_at IS NULL AND partition_key = 'k1'"), "the poison row and the 8 behind it wait")

	// New rows for the blocked key wait; other keys keep flowing.
	b.write(t, 3, 3)
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, b.countWhere(t, "published_at IS NULL"), "only k1 is blocked")

	lag, err := outbox.LagOf(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, int64(1), lag.Quarantined)
	require.Equal(t, int64(9), lag.Pending)
	q, err := outbox.ListQuarantined(ctx, b.pool, 10)
	require.NoError(t, err)
	require.Len(t, q, 1)
	require.Equal(t, poison.EventID, q[0].EventID)
	require.Equal(t, int64(9), q[0].BlockedBehind)

	// The operator fixes the cause and retries: k1 drains in order.
	b.rec.setFail(nil)
	n, err := outbox.RetryQuarantined(ctx, b.pool, []int64{q[0].ID})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	b.rec.requireKeyOrder(t)
}

func TestRowFailingWhileItsDestinationWorksIsQuarantinedAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	written := b.write(t, 2, 2)
	bad := written[0].EventID
	// The other row keeps the destination answering, so the failures are the row's own.
	b.rec.setFail(func(e *outbox.Event) error {
		if e.EventID == bad {
			return errors.New("InternalError")
		}
		return nil
	})
	good := b.relay(t, func(c *outbox.RelayConfig) { c.MaxAttempts = 3 })
	drainUntil(t, good, func() bool {
		if b.countWhere(t, "published_at IS NULL AND NOT (event_id = '"+bad.String()+"')") == 0 {
			b.write(t, 2, 2) // keep rows flowing to the same destination (k1; k0 waits behind the bad row)
		}
		return b.countWhere(t, "quarantined_at IS NOT NULL") == 1
	})
	require.Equal(t, 1, b.countWhere(t, "attempts = 3 AND last_error LIKE '%InternalError%' AND event_id = '"+bad.String()+"'"))
}

func TestLoneFailingRowIsAnOutageAndQuarantinedOnlyAfterTheOutageLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 1, 1)
	b.rec.setFail(func(*outbox.Event) error { return errors.New("InternalError") })
	r := b.relay(t, func(c *outbox.RelayConfig) { c.MaxAttempts = 2; c.OutageLimit = time.Second })
	start := time.Now()
	st, err := r.RunOnce(context.Background())
	require.NoError(t, err)
	require.Positive(t, st.Outage, "nothing sent to the destination succeeds: its failure, not the row's")
	require.Equal(t, 1, b.countWhere(t, "attempts = 0 AND failing_since IS NOT NULL AND last_error LIKE '%InternalError%'"))
	require.Len(t, r.DestinationsDown(), 1)

	drainUntil(t, r, func() bool { return b.countWhere(t, "quarantined_at IS NOT NULL") == 1 })
	require.Equal(t, 1, b.countWhere(t, "attempts = 0 AND quarantined_at IS NOT NULL"), "quarantined with no attempt counted")
	// Not before the outage limit: the row failed no earlier than start. (quarantined_at is the
	// quarantining round's start, so on a busy machine it can precede failing_since + the limit
	// by that round's length; the decision itself is what the limit bounds.)
	require.GreaterOrEqual(t, time.Since(start), time.Second, "quarantined by the outage limit, never by attempts")
}

func TestUnknownTopicIsQuarantinedAtOnceAndDefaultTopicCatchesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES (gen_random_uuid(), 'payments', 'payment', 'p-1', 'PaymentTaken', 'p-1', '{}')`)
	require.NoError(t, err)
	st, err := b.relay(t).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Quarantined)
	require.Equal(t, 1, b.countWhere(t, `attempts = 1 AND last_error LIKE '%unknown topic "payments"%'`))

	_, err = outbox.RetryAllQuarantined(ctx, b.pool)
	require.NoError(t, err)
	st, err = b.relay(t, func(c *outbox.RelayConfig) { c.DefaultTopic = "arn:aws:sns:us-east-1:000000000000:catch-all" }).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Published)
}

func TestRowsInsertedByPlainSQLArePublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES ('0190f5c2-0000-7000-8000-000000000001', 'orders', 'order', 'o-9', 'OrderShipped', 'o-9', '{"carrier": "dhl"}')`)
	require.NoError(t, err)
	st, err := b.relay(t).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Published)
	e := b.rec.received[0]
	require.Equal(t, "0190f5c2-0000-7000-8000-000000000001", e.EventID.String())
	require.Equal(t, "OrderShipped", e.EventType)
	require.Equal(t, `{"carrier": "dhl"}`, string(e.Payload))
	require.Empty(t, e.Headers)
}

func TestRunFindsNewRowsByPollingWithoutATrigger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var triggers int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'outbox_event'::regclass AND NOT tgisinternal`).Scan(&triggers))
	require.Zero(t, triggers, "producers' commits carry no trigger")
	// Only polling (the default interval) can find rows written after Run started: the walk
	// over every pending key happens once an hour.
	r := b.relay(t, func(c *outbox.RelayConfig) { c.PollInterval = 0; c.RescanInterval = time.Hour })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// Rows keep coming for two seconds: whatever Run's start found, the later ones can only be
	// found by the poll.
	const batches = 20
	for range batches {
		b.write(t, 5, 5)
		time.Sleep(100 * time.Millisecond)
	}
	testwait.Progress(t, "every row published before the hour-long rescan: found by the poll", func() (int, bool) {
		n := b.rec.count()
		return n, n >= 5*batches
	})
	require.Equal(t, 5*batches, b.rec.count(), "published long before the hour-long rescan: found by the poll")
	cancel()
	require.NoError(t, <-done)
	b.rec.requireKeyOrder(t)
}

// With IdleStop, Run publishes while rows keep coming and returns by itself once the outbox
// is quiet, losing nothing: what it left (a row committed as it stopped) the next start takes.
func TestRunStopsWhenIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, func(c *outbox.RelayConfig) { c.IdleStop = 2 * time.Second })
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }() // no deadline: only idleness ends it
	const batches = 10
	for range batches {
		b.write(t, 5, 5)
		time.Sleep(100 * time.Millisecond)
	}
	w := testwait.Watch[int](t, "Run returned by itself once idle")
	for returned := false; !returned; {
		select {
		case err := <-done:
			require.NoError(t, err)
			returned = true
		case <-time.After(100 * time.Millisecond):
			w.Check(b.rec.count())
		}
	}
	_, err := b.relay(t).RunOnce(context.Background()) // the next start
	require.NoError(t, err)
	require.Equal(t, 5*batches, b.rec.count(), "every row published once")
	b.rec.requireKeyOrder(t)
}

// A row whose transaction commits after later rows were published (its id below the relay's
// frontier) is found by the poll's watch of missing ids, not only by the next rescan.
func TestRunFindsALateCommitBelowItsFrontier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	r := b.relay(t, func(c *outbox.RelayConfig) { c.RescanInterval = time.Hour })
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	b.write(t, 1, 1)
	testwait.Until(t, "the first row published", func() bool { return b.rec.count() == 1 })

	late, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = late.Rollback(ctx) }()
	_, err = outbox.Write(ctx, late, outbox.Message{Topic: testTopic, AggregateType: "order", AggregateID: "late",
		EventType: "OrderCreated", PartitionKey: "k0", Payload: json.RawMessage(`{"late":true}`)})
	require.NoError(t, err)
	b.write(t, 3, 1) // higher ids of the same key commit and are published first
	testwait.Until(t, "the later rows of the key published", func() bool { return b.rec.count() == 4 })
	require.NoError(t, late.Commit(ctx))
	testwait.Until(t, "the late row is published long before the hour-long rescan", func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, 5, b.rec.count())
}

func TestRelayConfigIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := outbox.NewRelay(b.pool, outbox.RelayConfig{})
	require.ErrorContains(t, err, "Publisher is required")
	require.ErrorContains(t, err, "Topics or DefaultTopic is required")
	_, err = outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: b.rec, DefaultTopic: "x", BatchSize: -1, Lease: time.Second, PublishTimeout: 2 * time.Second})
	require.ErrorContains(t, err, "BatchSize must be between 1 and 10000, got -1")
	require.ErrorContains(t, err, "Lease (1s) must be longer than PublishTimeout")
	_, err = outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: b.rec, DefaultTopic: "x", BatchSize: 9223372036854775807, PollInterval: -time.Second})
	require.ErrorContains(t, err, "BatchSize must be between 1 and 10000, got 9223372036854775807")
	require.ErrorContains(t, err, "PollInterval must be between 1ms and 1h0m0s, got -1s")
	require.Less(t, strings.Index(err.Error(), "BatchSize"), strings.Index(err.Error(), "PollInterval"), "problems are reported in field order")
}

// hungLease is the hung relay's lease: the other relay's first RunOnce must end within it (A
// still holding its keys), a single round, which a machine with every core busy does in far
// less; the drain after it waits out the lease.
const hungLease = 20 * time.Second

func TestHungRelayLosesItsKeysAfterTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 20, 20)

	// Relay A's broker call hangs, ignoring cancellation, far beyond A's lease: A sits idle in
	// its round's transaction, like a frozen Lambda sandbox.
	release, started := make(chan struct{}), make(chan struct{}, 100)
	hung := newRecorder()
	hung.fail = func(*outbox.Event) error { started <- struct{}{}; <-release; return nil }
	a, err := outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: hung, Topics: map[string]string{testTopic: testARN},
		Lease: hungLease, PublishTimeout: hungLease / 2, PublishConcurrency: 1, Pipelines: 1, Logger: testLogger()})
	require.NoError(t, err)
	aDone := make(chan error, 1)
	go func() { _, err := a.RunOnce(context.Background()); aDone <- err }()
	testwait.Receive(t, "relay A claims and publishes", started)

	// While A holds the keys, relay B finds nothing; once PostgreSQL ends A's idle session
	// (after the lease), B publishes everything.
	st, err := b.relay(t).RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, st.Claimed, "keys held by A's round are not claimable")
	drainUntil(t, b.relay(t), func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Equal(t, 20, b.rec.count())

	close(release)
	require.Error(t, <-aDone, "A's transaction was ended under it; it records nothing")
	b.rec.requireKeyOrder(t)
}

func TestRunRepublishesReplayedRowsInKeyOrderWithoutWaitingForARescan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 30, 3)
	// A relay that publishes new rows while a walk over every key happens only once an hour:
	// replayed rows get no new ids, so only the admin epoch can tell it about them.
	r := b.relay(t, func(c *outbox.RelayConfig) { c.PollInterval = 20 * time.Millisecond; c.RescanInterval = time.Hour })
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	testwait.Until(t, "every row published", func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })

	n, err := outbox.Replay(ctx, b.pool, outbox.ReplayFilter{Since: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(30), n)
	b.write(t, 3, 3) // new rows of the same keys arrive meanwhile
	testwait.Until(t, "the replayed and the new rows published", func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, 63, b.rec.count(), "every row once, the replayed ones twice")
	// Replayed rows went out again before the new rows of their key.
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	for key, ids := range b.rec.byKey {
		second := ids[10:] // the first 10 are the original publication
		for i := 1; i < len(second); i++ {
			require.Greater(t, second[i], second[i-1], "key %s: replay and new rows in id order", key)
		}
	}
}

// pollCounter counts the relay's polls (pollSQL, sent in batches) on a pool's connections
// before its first claim (the advisory locks of a round).
type pollCounter struct {
	mu      sync.Mutex
	n       int
	claimed bool
}

func (c *pollCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *pollCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *pollCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *pollCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case strings.Contains(d.SQL, "pg_try_advisory_lock"):
		c.claimed = true
	case strings.Contains(d.SQL, "WHERE id > $1 ORDER BY id LIMIT $2") && !c.claimed:
		c.n++
	}
}
func (c *pollCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A pass over a backlog larger than one poll reads (pollRows, 10,000) polls once before its
// first claim and moves its frontier to the outbox's end: its sweep walks every pending key, the backlog's among them, so
// it claims at once instead of paging through the backlog first. Every row is published once,
// each key in order.
func TestAPassOverABacklogPollsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	polls := &pollCounter{}
	pcfg.ConnConfig.Tracer = polls
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &bundle{pool: pool, rec: newRecorder()}
	r := b.relay(t)
	_, err = r.RunPass(ctx) // the relay has looked at the empty outbox: its frontier is before the backlog
	require.NoError(t, err)

	b.write(t, 25_000, 100)
	polls.mu.Lock()
	polls.n, polls.claimed = 0, false
	polls.mu.Unlock()
	st, err := r.RunPass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, polls.n, "one poll before the first claim, not one per 10,000 rows")
	require.Equal(t, 25_000, st.Published)
	var newest int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(id) FROM outbox_event`).Scan(&newest))
	require.Equal(t, newest, r.Frontier())
	require.Equal(t, 25_000, b.rec.count())
	b.rec.requireKeyOrder(t)
	require.Zero(t, b.countWhere(t, "published_at IS NULL"))
}
