package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// convert turns the bundle's outbox into a partitioned one with partitions of size ids.
func (b *bundle) convert(t *testing.T, size int64, ahead int) outbox.PartitionPlan {
	t.Helper()
	plan, err := outbox.ConvertToPartitioned(context.Background(), b.pool, &outbox.PartitionOptions{Size: size, Ahead: ahead}, nil)
	require.NoError(t, err)
	return plan
}

// layout returns the outbox's partitions.
func (b *bundle) layout(t *testing.T) outbox.PartitionLayout {
	t.Helper()
	l, err := outbox.Partitions(context.Background(), b.pool)
	require.NoError(t, err)
	return l
}

// rowsByPartition counts outbox rows per partition, by the table that holds them.
func (b *bundle) rowsByPartition(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT tableoid::regclass::text, count(*) FROM outbox_event GROUP BY 1")
	require.NoError(t, err)
	out := map[string]int{}
	var (
		name string
		n    int
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil })
	require.NoError(t, err)
	return out
}

// writeSQL inserts n rows with plain SQL (as another language would), in keys round robin, with
// extra column values (e.g. created_at, published_at) from the given expressions.
func (b *bundle) writeSQL(t *testing.T, n, keys int, createdAt, publishedAt string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), fmt.Sprintf(`
		INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o' || i, 'OrderCreated', 'k' || (i %% %d), jsonb_build_object('n', i), %s, %s
		FROM generate_series(1, %d) i`, keys, createdAt, publishedAt, n))
	require.NoError(t, err)
}

// Converting a table that holds published and pending rows, while producers write and a relay
// publishes, keeps every row exactly once (none copied, none lost), and the relay publishes
// every pending row, each key in id order, across the former table and the new partitions.
func TestConvertToPartitionedKeepsEveryRowAndTheRelayPublishesThemInKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 600, 20)
	_, err := b.relay(t).RunOnce(ctx)
	require.NoError(t, err)
	b.write(t, 900, 20) // pending when the conversion starts

	// Producers and a relay keep working through the conversion.
	runCtx, stop := context.WithCancel(ctx)
	produceCtx, stopProducing := context.WithCancel(ctx)
	var (
		wg, producing sync.WaitGroup
		written       atomic.Int64
		relayed       error
	)
	written.Store(1500)
	wg.Add(1)
	producing.Add(1)
	go func() {
		defer wg.Done()
		relayed = b.relay(t).Run(runCtx)
	}()
	go func() {
		defer producing.Done()
		for produceCtx.Err() == nil {
			msgs := make([]outbox.Message, 10)
			for i := range msgs {
				msgs[i] = outbox.Message{Topic: testTopic, EventType: "OrderCreated", AggregateID: fmt.Sprintf("c%d", i),
					PartitionKey: fmt.Sprintf("k%d", i), Payload: json.RawMessage(`{}`)}
			}
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				return
			}
			if _, err := outbox.Write(ctx, tx, msgs...); err != nil {
				_ = tx.Rollback(ctx)
				t.Errorf("write during conversion: %v", err)
				return
			}
			if err := tx.Commit(ctx); err != nil {
				t.Errorf("commit during conversion: %v", err)
				return
			}
			written.Add(10)
		}
	}()

	var steps []string
	plan, err := outbox.ConvertToPartitioned(ctx, b.pool, &outbox.PartitionOptions{Size: 300, Ahead: 3}, func(s string) { steps = append(steps, s) })
	stopProducing()
	producing.Wait()
	require.NoError(t, err)
	require.NotEmpty(t, steps)
	for _, s := range steps {
		t.Log(s)
	}
	require.True(t, b.layout(t).Partitioned)

	// The former table takes ids up to the bound (at least an hour of them at the observed
	// rate); moving the identity there makes the next rows land in the new partitions.
	_, err = b.pool.Exec(ctx, fmt.Sprintf("ALTER TABLE outbox_event ALTER COLUMN id RESTART WITH %d", plan.Bound))
	require.NoError(t, err)
	// Maintenance keeps partitions ahead of them.
	for range 6 {
		b.write(t, 150, 20)
		written.Add(150)
		_, err := outbox.MaintainPartitions(ctx, b.pool, &outbox.PartitionOptions{Size: 300, Ahead: 3})
		require.NoError(t, err)
	}
	testwait.Progress(t, "the relay drains the partitioned outbox", func() (int, bool) {
		left := b.countWhere(t, "published_at IS NULL")
		return left, left == 0
	})
	stop()
	wg.Wait()
	require.NoError(t, relayed)

	total := int(written.Load())
	require.Equal(t, total, b.countWhere(t, "true"), "every row written is there")
	require.Equal(t, total, b.countWhere(t, "event_id IN (SELECT event_id FROM outbox_event GROUP BY event_id HAVING count(*) = 1)"), "no row twice")
	parts := b.rowsByPartition(t)
	require.GreaterOrEqual(t, len(parts), 3, "rows are spread over the former table and new partitions: %v", parts)
	require.Contains(t, parts, "outbox_event_p0")

	// Every row reached the broker, each key in id order.
	b.rec.requireKeyOrder(t)
	got := map[string]bool{}
	for _, e := range b.rec.received {
		got[e.EventID.String()] = true
	}
	require.Len(t, got, total, "every row was published")
}

// expired is the SQL of a row written 41 days ago and published 40 days ago.
const (
	old        = "now() - interval '41 days'"
	oldPublish = "now() - interval '40 days'"
)

// Retention drops a partition only when every row in it was published before the cutoff: never
// one with an unpublished (quarantined) row, one with a row published after the cutoff (a replay
// republished it), one whose newest row is younger, the partition new ids go to, or those ahead.
func TestMaintainPartitionsDropsOnlyPartitionsWhoseRowsWereAllPublishedBeforeTheRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	plan := b.convert(t, 100, 6) // an empty table: [MINVALUE, 100), then 100 ids each
	require.Equal(t, int64(100), plan.Bound)

	b.writeSQL(t, 99, 5, old, oldPublish)  // ids 1-99: the former table, expired
	b.writeSQL(t, 100, 5, old, oldPublish) // 100-199: expired
	b.writeSQL(t, 100, 5, old, oldPublish) // 200-299: expired but for one quarantined row
	_, err := b.pool.Exec(ctx, "UPDATE outbox_event SET published_at = NULL, quarantined_at = now() WHERE id = 250")
	require.NoError(t, err)
	b.writeSQL(t, 100, 5, old, "CASE WHEN i = 50 THEN now() - interval '1 hour' ELSE "+oldPublish+" END") // 300-399: one row republished lately
	b.writeSQL(t, 100, 5, "CASE WHEN i = 100 THEN now() ELSE "+old+" END", oldPublish)                    // 400-499: its newest row is young
	b.writeSQL(t, 50, 5, "now()", "now()")                                                                // 500-549: where new ids go
	before := b.countWhere(t, "true")

	rep, err := outbox.MaintainPartitions(ctx, b.pool, &outbox.PartitionOptions{Size: 100, Ahead: 2, Retention: 30 * 24 * time.Hour})
	require.NoError(t, err)
	require.True(t, rep.Partitioned)
	var dropped []string
	for _, p := range rep.Dropped {
		dropped = append(dropped, p.Name)
	}
	require.ElementsMatch(t, []string{"outbox_event_p0", "outbox_event_p0000000000000000100"}, dropped)
	kept := map[string]string{}
	for _, k := range rep.Kept {
		kept[k.Name] = k.Reason
	}
	require.Len(t, kept, 3, "kept: %v", kept)
	require.Contains(t, kept["outbox_event_p0000000000000000200"], "not published")
	require.Contains(t, kept["outbox_event_p0000000000000000300"], "published after the cutoff")
	require.Contains(t, kept["outbox_event_p0000000000000000400"], "newest row was written at")

	require.Equal(t, before-199, b.countWhere(t, "true"), "exactly the rows of the two dropped partitions are gone")
	require.Equal(t, 1, b.countWhere(t, "published_at IS NULL"), "the quarantined row stays")
	require.Zero(t, b.countWhere(t, "id < 200"))

	// Partitions stay ready above the newest id, and nothing more expires on a second run.
	var ahead int
	for _, p := range b.layout(t).Partitions {
		if !p.Default && p.From > 549 {
			ahead++
		}
	}
	require.GreaterOrEqual(t, ahead, 2)
	rep, err = outbox.MaintainPartitions(ctx, b.pool, &outbox.PartitionOptions{Size: 100, Ahead: 2, Retention: 30 * 24 * time.Hour})
	require.NoError(t, err)
	require.Empty(t, rep.Dropped)
	require.Empty(t, rep.Created)
}

// A Replay that makes the rows of an expired partition unpublished, in a transaction still open
// while maintenance runs, keeps that partition: maintenance waits for the Replay's lock, then
// sees its rows unpublished. With a short LockTimeout it gives up instead, dropping nothing.
func TestMaintainPartitionsNeverDropsAPartitionAConcurrentReplayMadeUnpublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.convert(t, 100, 3)
	b.writeSQL(t, 99, 5, old, oldPublish)  // the former table
	b.writeSQL(t, 100, 5, old, oldPublish) // 100-199
	b.writeSQL(t, 50, 5, "now()", "now()") // 200-249: where new ids go; [300, 400) is ready ahead
	retention := &outbox.PartitionOptions{Size: 100, Ahead: 1, Retention: 30 * 24 * time.Hour, LockTimeout: 100 * time.Millisecond}

	replay, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = replay.Rollback(ctx) }()
	n, err := outbox.Replay(ctx, replay, outbox.ReplayFilter{Since: time.Now().Add(-42 * 24 * time.Hour), Until: time.Now().Add(-40 * 24 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(199), n)

	// The Replay holds its lock: maintenance gives up on both partitions and drops nothing.
	rep, err := outbox.MaintainPartitions(ctx, b.pool, retention)
	require.NoError(t, err)
	require.Empty(t, rep.Dropped)
	expired := []string{"outbox_event_p0", "outbox_event_p0000000000000000100"}
	require.ElementsMatch(t, expired, keptReasons(rep, "busy"))

	// With time to wait, maintenance queues behind the Replay and checks again once it commits.
	patient := *retention
	patient.LockTimeout = time.Minute
	done := make(chan error, 1)
	var rep2 outbox.PartitionReport
	go func() {
		var err error
		rep2, err = outbox.MaintainPartitions(ctx, b.pool, &patient)
		done <- err
	}()
	testwait.Until(t, "maintenance waits for the Replay's lock", func() bool {
		var waiting bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND relation = 'outbox_event'::regclass)`).Scan(&waiting))
		return waiting
	})
	require.NoError(t, replay.Commit(ctx))
	require.NoError(t, <-done)
	require.Empty(t, rep2.Dropped, "a partition with replayed (unpublished) rows is never dropped")
	require.ElementsMatch(t, expired, keptReasons(rep2, "not published"))
	require.Equal(t, 199, b.countWhere(t, "published_at IS NULL"), "every replayed row is there to be published again")
}

// keptReasons returns the partitions the report kept for a reason containing why.
func keptReasons(rep outbox.PartitionReport, why string) []string {
	var out []string
	for _, k := range rep.Kept {
		if strings.Contains(k.Reason, why) {
			out = append(out, k.Name)
		}
	}
	return out
}

// Purge on a partitioned outbox drops the expired partitions and deletes the expired rows the
// default partition caught (ids beyond the partitions created ahead), row by row.
func TestPurgeOnAPartitionedOutboxDropsPartitionsAndPurgesTheDefaultPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.convert(t, 100, 1)                   // [MINVALUE, 100), [100, 200), default
	b.writeSQL(t, 400, 5, old, oldPublish) // 99 + 100 rows in partitions, 201 in the default one
	b.writeSQL(t, 10, 5, old, "NULL")      // unpublished, in the default partition
	require.Equal(t, 211, b.rowsByPartition(t)["outbox_event_default"])
	_, err := b.pool.Exec(ctx, "ANALYZE outbox_event_p0, outbox_event_p0000000000000000100")
	require.NoError(t, err)

	n, err := outbox.Purge(ctx, b.pool, 30*24*time.Hour, &outbox.PurgeOptions{BatchSize: 50})
	require.NoError(t, err)
	require.Equal(t, int64(400), n, "99 + 100 rows dropped with their partitions, 201 deleted from the default partition")
	require.Equal(t, 10, b.countWhere(t, "true"), "only the unpublished rows are left")
	require.Equal(t, 10, b.countWhere(t, "published_at IS NULL"))
	names := map[string]bool{}
	for _, p := range b.layout(t).Partitions {
		names[p.Name] = true
	}
	require.False(t, names["outbox_event_p0"])
	require.False(t, names["outbox_event_p0000000000000000100"])
	require.True(t, names["outbox_event_default"], "the default partition is never dropped")
}

// Four relays racing over an outbox spread across many partitions publish every row, each key
// in id order, never one key in two calls at once.
func TestRacingRelaysDrainAPartitionedOutboxInKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.convert(t, 1000, 25)
	b.write(t, 20000, 200)
	parts := b.rowsByPartition(t)
	require.GreaterOrEqual(t, len(parts), 20, "rows span many partitions: %v", parts)
	require.NotContains(t, parts, "outbox_event_default")
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

// A table PostgreSQL cannot carry over to a partitioned table as it is (a trigger, a view
// reading it) is refused with every problem named, and nothing is changed.
func TestConvertToPartitionedRefusesWhatItCannotCarryOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 10, 2)
	for _, s := range []string{
		`CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`,
		`CREATE TRIGGER outbox_audit AFTER INSERT ON outbox_event FOR EACH ROW EXECUTE FUNCTION audit()`,
		`CREATE VIEW recent_events AS SELECT id, topic FROM outbox_event`,
	} {
		_, err := b.pool.Exec(ctx, s)
		require.NoError(t, err)
	}
	_, err := outbox.PlanPartitioning(ctx, b.pool, nil)
	require.ErrorContains(t, err, "outbox_audit")
	require.ErrorContains(t, err, "recent_events")
	_, err = outbox.ConvertToPartitioned(ctx, b.pool, nil, nil)
	require.ErrorContains(t, err, "nothing was changed")
	l := b.layout(t)
	require.False(t, l.Partitioned)
	require.Zero(t, l.ConversionBound, "no bound was added")
	require.Equal(t, 10, b.countWhere(t, "true"))
}

// A conversion interrupted after it added its bound is reported by maintenance and finished by
// running it again, with the same bound.
func TestAnInterruptedConversionIsFinishedByRunningItAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 50, 5)
	// What the first step leaves behind when the process dies right after it.
	_, err := b.pool.Exec(ctx, "ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_partition_bound CHECK (id < 5000) NOT VALID")
	require.NoError(t, err)

	rep, err := outbox.MaintainPartitions(ctx, b.pool, nil)
	require.NoError(t, err)
	require.False(t, rep.Partitioned)
	require.Len(t, rep.Warnings, 1)
	require.Contains(t, rep.Warnings[0], "did not finish")
	require.Equal(t, int64(5000), b.layout(t).ConversionBound)

	plan, err := outbox.PlanPartitioning(ctx, b.pool, &outbox.PartitionOptions{Size: 1000})
	require.NoError(t, err)
	require.True(t, plan.Resume)
	require.Equal(t, int64(5000), plan.Bound)
	require.NotContains(t, strings.Join(plan.Steps, "\n"), "NOT VALID to outbox_event", "the bound is not added twice")
	_, err = outbox.ConvertToPartitioned(ctx, b.pool, &outbox.PartitionOptions{Size: 1000}, nil)
	require.NoError(t, err)
	l := b.layout(t)
	require.True(t, l.Partitioned)
	require.Equal(t, "outbox_event_p0", l.Partitions[0].Name)
	require.Equal(t, int64(5000), l.Partitions[0].To)
	require.Equal(t, int64(5000), l.Partitions[1].From)
	require.Equal(t, 50, b.countWhere(t, "true"))
	var constraints int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conname = 'outbox_event_partition_bound'`).Scan(&constraints))
	require.Zero(t, constraints, "the bound is gone once the partition's range holds it")
}
