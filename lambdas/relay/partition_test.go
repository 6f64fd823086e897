package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

// idle stands in for the relay: it waits for the invocation's end.
type idle struct{}

func (idle) Run(ctx context.Context) error                     { <-ctx.Done(); return nil }
func (idle) RunOnce(ctx context.Context) (outbox.Stats, error) { return outbox.Stats{}, nil }

// A relay asked to maintain a partitioned outbox does it at each invocation, alongside the
// relay: it creates partitions ahead and, with a retention, drops the partitions whose rows all
// expired, never one holding a row published within the retention.
func TestHandleMaintainsAPartitionedOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := partition.Convert(ctx, pool, partition.Outbox, &partition.Options{Size: 100, Ahead: 2}, nil) // [MINVALUE, 100), [100, 200), [200, 300), default
	require.NoError(t, err)
	insert := func(n int, created, published string) {
		_, err := pool.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
			SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k', '{}', `+created+`, `+published+` FROM generate_series(1, $1)`, n)
		require.NoError(t, err)
	}
	insert(199, "now() - interval '41 days'", "now() - interval '40 days'") // ids 1-199: expired
	insert(30, "now()", "now()")                                            // 200-229

	h := &handler{relay: idle{}, lag: pool, stopBefore: time.Second, log: slog.New(slog.DiscardHandler), db: pool,
		partitions: &partition.Options{Size: 100, Ahead: 2, Retention: 30 * 24 * time.Hour}}
	ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = h.Handle(ictx, scheduledEvent(t))
	require.NoError(t, err)

	layout, err := partition.Read(ctx, pool, partition.Outbox)
	require.NoError(t, err)
	var names []string
	ahead := 0
	for _, p := range layout.Partitions {
		names = append(names, p.Name)
		if !p.Default && p.From > 229 {
			ahead++
		}
	}
	require.NotContains(t, names, "outbox_event_p0", "expired: dropped")
	require.NotContains(t, names, "outbox_event_p0000000000000000100", "expired: dropped")
	require.Contains(t, names, "outbox_event_p0000000000000000200", "it holds rows published now")
	require.Equal(t, 2, ahead, "partitions are kept ready above the newest id")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event`).Scan(&left))
	require.Equal(t, 30, left)
}

// The maintenance settings come from the environment, and only they switch it on; a bad one
// stops the cold start with an error naming it.
func TestPartitionOptionsFromTheEnvironment(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) lambdaenv.Getenv {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	opts, err := partitionOptions(env())
	require.NoError(t, err)
	require.Nil(t, opts, "not asked: the relay does no DDL (its role may not)")
	opts, err = partitionOptions(env(lambdaenv.OutboxPartitionInterval, "24h"))
	require.NoError(t, err)
	require.Equal(t, partition.Options{Interval: partition.DefaultInterval}, *opts, "no retention: nothing is dropped")
	opts, err = partitionOptions(env(lambdaenv.OutboxRetention, "720h", lambdaenv.OutboxPartitionInterval, "6h"))
	require.NoError(t, err)
	require.Equal(t, partition.Options{Interval: 6 * time.Hour, Retention: 720 * time.Hour}, *opts)
	for _, bad := range [][]string{
		{lambdaenv.OutboxRetention, "30 days"},
		{lambdaenv.OutboxPartitionInterval, "500ms"},
	} {
		_, err := partitionOptions(env(bad...))
		require.ErrorContains(t, err, bad[0])
		other := lambdaenv.OutboxRetention
		if bad[0] == other {
			other = lambdaenv.OutboxPartitionInterval
		}
		require.NotContains(t, err.Error(), other, "only the bad variable is named")
	}
}
