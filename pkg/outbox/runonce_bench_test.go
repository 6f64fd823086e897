package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// ackAll is a broker that acknowledges every event at once (the bench's 0 ms stub) and counts
// them.
type ackAll struct{ n atomic.Int64 }

func (a *ackAll) PublishBatch(_ context.Context, _ string, events []*outbox.Event) []error {
	a.n.Add(int64(len(events)))
	return make([]error, len(events))
}

// BenchmarkRunOnceDrain is the bench's "RunOnce in a loop" contender (bench/relay.go) as a Go
// benchmark, for profiling the relay's own CPU per event: each iteration seeds 20,000 pending
// rows in 1,000 keys (row i of key i mod 1,000, a small payload; not timed) and drains them
// with one relay at its defaults, on a pool of RelayConfig.PoolSize() connections, calling
// RunOnce until nothing is pending. It reports events/s.
//
//	go run ./internal/cmd/devenv -- go test ./pkg/outbox -run '^$' -bench RunOnceDrain -cpuprofile /tmp/runonce.prof
func BenchmarkRunOnceDrain(b *testing.B) {
	benchmarkDrain(b, func(ctx context.Context, r *outbox.Relay, drained func() bool) {
		for {
			if _, err := r.RunOnce(ctx); err != nil {
				b.Fatal(err)
			}
			if drained() {
				return
			}
		}
	})
}

// BenchmarkRunDrain is BenchmarkRunOnceDrain with the relay's Run (the bench's "1 instance"
// contender) draining the same backlog, stopped once nothing is pending: run both in one
// process to compare RunOnce with Run on the same machine at the same time.
//
//	go run ./internal/cmd/devenv -- go test ./pkg/outbox -run '^$' -bench 'RunOnceDrain|RunDrain' -count 3
func BenchmarkRunDrain(b *testing.B) {
	benchmarkDrain(b, func(ctx context.Context, r *outbox.Relay, drained func() bool) {
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = r.Run(ctx)
		}()
		for !drained() {
			time.Sleep(2 * time.Millisecond)
		}
		cancel()
		<-done
	})
}

// benchmarkDrain seeds the backlog of BenchmarkRunOnceDrain for each iteration and times drain,
// which returns once drained reports that no row is pending.
func benchmarkDrain(b *testing.B, drain func(ctx context.Context, r *outbox.Relay, drained func() bool)) {
	const rows, keys = 20_000, 1_000
	ctx := context.Background()
	cfg := outbox.RelayConfig{Topics: map[string]string{testTopic: testARN}}
	pc, err := pgxpool.ParseConfig(testdb.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	pc.MaxConns = int32(cfg.PoolSize())
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	var pub *ackAll
	// drained asks the database only once the broker has every row: Run's loop calls it every
	// few milliseconds, and a count of the pending rows each time would slow the relay it
	// measures.
	drained := func() bool {
		if pub.n.Load() < rows {
			return false
		}
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE published_at IS NULL`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		return left == 0
	}
	var events int
	for b.Loop() {
		b.StopTimer()
		if _, err := pool.Exec(ctx, `TRUNCATE outbox_event RESTART IDENTITY`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `
			INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			SELECT gen_random_uuid(), $3, 'order', 'o-' || (i % $2), 'OrderCreated', 'k-' || (i % $2),
			       jsonb_build_object('orderId', i, 'customerId', 'c-' || (i % 977), 'totalCents', 1299, 'currency', 'EUR', 'schemaVersion', 1)
			FROM generate_series(1, $1::int) AS i`, rows, keys, testTopic); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox_event`); err != nil {
			b.Fatal(err)
		}
		pub = &ackAll{}
		cfg.Publisher = pub
		r, err := outbox.NewRelay(pool, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		drain(ctx, r, drained)
		events += rows
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}
