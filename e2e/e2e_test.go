package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localrun"
)

// Happy path on a standard topic and queue: nothing lost, nothing applied twice.
func TestHappyPathStandard(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.place(t, 150, 15, 5*time.Millisecond, nil)
	b.waitApplied(t, 60*time.Second)
}

// Happy path on FIFO: per-customer (partition key = message group) order holds end to end.
func TestHappyPathFIFO(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *localrun.StackOptions) { o.FIFO = true })
	b.place(t, 150, 6, 5*time.Millisecond, nil)
	v := b.waitApplied(t, 60*time.Second)
	require.Zero(t, v.OrderViolations)
}

// The relay process is SIGKILLed again and again while it publishes; its leased rows are taken
// over after the lease, and republished rows are deduplicated by the inbox.
func TestRelayKilledRepeatedly(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *localrun.StackOptions) { o.RelayEvery = time.Second })
	ctx, stop := context.WithCancel(context.Background())
	var kills atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			time.Sleep(700 * time.Millisecond)
			kills.Add(int64(b.stack.Relay.KillRuntimes()))
		}
	}()
	b.place(t, 300, 20, 15*time.Millisecond, nil)
	stop()
	wg.Wait()
	require.Positive(t, kills.Load(), "the relay was killed")
	t.Logf("relay processes killed: %d", kills.Load())
	b.waitApplied(t, 90*time.Second)
}

// A fault-injecting proxy in front of the endpoint throttles, fails, and swallows the responses
// of a share of the relay's SNS calls (the last case publishes but looks failed: duplicates).
func TestSNSFailingAndThrottling(t *testing.T) {
	t.Parallel()
	var proxy *localrun.FaultProxy
	b := setup(t, func(o *localrun.StackOptions) {
		var err error
		proxy, err = localrun.StartFaultProxy(o.Endpoint, localrun.Faults{Throttle: 0.15, Unavailable: 0.10, LoseResponse: 0.15})
		require.NoError(t, err)
		t.Cleanup(proxy.Close)
		o.RelaySNSEndpoint = proxy.URL
	})
	b.place(t, 200, 20, 5*time.Millisecond, nil)
	b.waitApplied(t, 90*time.Second)
	s := proxy.Stats()
	t.Logf("proxy: %+v", s)
	require.Positive(t, s.Throttled)
	require.Positive(t, s.Unavailable)
	require.Positive(t, s.LostResponses)
	// A lost response means a batch was published and published again: the consumer saw more
	// deliveries than events, and the inbox kept each to one application (waitApplied).
	require.Greater(t, b.stack.Source.Stats().Deleted, int64(b.written), "duplicates were delivered")
}

// The database connections of the relay and the consumer are terminated (pg_terminate_backend)
// while the consumer holds its transactions open.
func TestDatabaseConnectionsTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *localrun.StackOptions) { o.MaxReceiveCount = 10 })
	ctx, stop := context.WithCancel(context.Background())
	var terminated atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			time.Sleep(250 * time.Millisecond)
			var n int64
			err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name IN ('sluice-relay', 'sluice-consumer')
				  AND state IN ('active', 'idle in transaction')`).Scan(&n)
			if err == nil {
				terminated.Add(n)
			}
		}
	}()
	b.place(t, 150, 15, 20*time.Millisecond, func(i int, o *demoapp.OrderCreated) { o.HoldMillis = 40 })
	time.Sleep(2 * time.Second)
	stop()
	wg.Wait()
	require.Positive(t, terminated.Load(), "connections were terminated mid-transaction")
	t.Logf("backends terminated: %d", terminated.Load())
	b.waitApplied(t, 90*time.Second)
}

// The consumer fails transiently for some messages (their first two deliveries); SQS delivers
// them again after the visibility timeout and they are applied once.
func TestConsumerTransientFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	failing := 0
	b.place(t, 120, 12, 5*time.Millisecond, func(i int, o *demoapp.OrderCreated) {
		if i%6 == 0 {
			o.FailAttempts = 2
			failing++
		}
	})
	b.waitApplied(t, 90*time.Second)
	require.GreaterOrEqual(t, b.stack.Source.Stats().ReportedFailures, int64(2*failing), "each failing message was reported failed twice")
}

// A poison message (an unknown currency) fails every delivery and ends in the DLQ while the rest
// flows; the operator adds the currency and redrives the DLQ; it is then applied once.
func TestPoisonMessageDLQFixedAndRedriven(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *localrun.StackOptions) { o.MaxReceiveCount = 2; o.VisibilityTimeout = 2 * time.Second })
	b.place(t, 40, 8, 5*time.Millisecond, nil)
	b.place(t, 1, 1, 0, func(_ int, o *demoapp.OrderCreated) { o.Customer, o.Currency = "poison", "XTS" })
	b.place(t, 40, 8, 5*time.Millisecond, nil)

	deadline := time.Now().Add(60 * time.Second)
	depth := 0
	for time.Now().Before(deadline) {
		var err error
		depth, err = localrun.Depth(b.ctx, b.stack.SQS, b.stack.Pipeline.DLQURL)
		require.NoError(t, err)
		if depth >= 1 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	require.Equal(t, 1, depth, "the poison message reached the DLQ")
	p, err := demoapp.ProgressOf(b.ctx, b.pool, b.prefix)
	require.NoError(t, err)
	require.Equal(t, b.written-1, p.Applied, "everything but the poison message was applied")

	_, err = b.pool.Exec(b.ctx, `INSERT INTO demo_currencies (code) VALUES ('XTS')`)
	require.NoError(t, err)
	moved, err := localrun.Redrive(b.ctx, b.stack.SQS, b.stack.Pipeline.DLQURL, b.stack.Pipeline.QueueURL, b.stack.Pipeline.FIFO)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	b.waitApplied(t, 60*time.Second)
}
