package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

// convert turns the bundle's outbox into a partitioned one with partitions of size ids.
func (b *bundle) convert(t *testing.T, size int64, ahead int) partition.Plan {
	t.Helper()
	plan, err := partition.Convert(context.Background(), b.pool, partition.Outbox, &partition.Options{Size: size, Ahead: ahead}, nil)
	require.NoError(t, err)
	return plan
}

// layout returns the outbox's partitions.
func (b *bundle) layout(t *testing.T) partition.Layout {
	t.Helper()
	l, err := partition.Read(context.Background(), b.pool, partition.Outbox)
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
	plan, err := partition.Convert(ctx, b.pool, partition.Outbox, &partition.Options{Size: 300, Ahead: 3}, func(s string) { steps = append(steps, s) })
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
		_, err := partition.Maintain(ctx, b.pool, partition.Outbox, &partition.Options{Size: 300, Ahead: 3})
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

// old and oldPublish are the SQL of a row written 41 days ago and published 40 days ago.
const (
	old        = "now() - interval '41 days'"
	oldPublish = "now() - interval '40 days'"
)

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
