package e2e

import (
	"context"
	"fmt"
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

// The relay process is SIGKILLed again and again while it publishes; its rounds die with their
// connections, the rows are claimed again and republished, and the inbox drops the duplicates.
func TestRelayKilledRepeatedly(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *localrun.StackOptions) { o.RelayEvery = time.Second })
	kills, stop := repeatFault(700*time.Millisecond, func(context.Context) int64 { return int64(b.stack.Relay.KillRuntimes()) })
	b.place(t, 300, 20, 15*time.Millisecond, nil)
	// However the machine schedules the relays, they die several times before the faults stop.
	b.waitUntil(t, time.Minute, "the relay was killed 3 times", func() (bool, string) {
		return kills() >= 3, fmt.Sprintf("%d kills", kills())
	})
	stop()
	t.Logf("relay processes killed: %d", kills())
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
	// A lost response means a batch was published and published again: the consumer receives
	// more deliveries than events (each is deleted once handled) and the inbox keeps each to one
	// application.
	b.waitUntil(t, time.Minute, "duplicates were delivered", func() (bool, string) {
		d := b.stack.Source.Stats().Deleted
		return d > int64(b.written), fmt.Sprintf("%d deliveries handled for %d events", d, b.written)
	})
	b.waitApplied(t, 30*time.Second)
}

// The database connections of the relay and the consumer are terminated (pg_terminate_backend)
// while the consumer holds its transactions open.
func TestDatabaseConnectionsTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *localrun.StackOptions) { o.MaxReceiveCount = 10 })
	terminated, stop := repeatFault(250*time.Millisecond, func(ctx context.Context) int64 {
		var n int64
		err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name IN ('sluice-relay', 'sluice-consumer')
			  AND state IN ('active', 'idle in transaction')`).Scan(&n)
		if err != nil {
			return 0
		}
		return n
	})
	b.place(t, 150, 15, 20*time.Millisecond, func(i int, o *demoapp.OrderCreated) { o.HoldMillis = 40 })
	b.waitUntil(t, time.Minute, "sessions terminated mid-statement or mid-transaction 5 times", func() (bool, string) {
		return terminated() >= 5, fmt.Sprintf("%d terminated", terminated())
	})
	stop()
	t.Logf("backends terminated: %d", terminated())
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
	// Each failing message fails while its SQS receive count is at most 2: twice, unless a
	// receive whose reply was lost in transit (counted by the queue, never seen by the
	// consumer) used up one of them: at least once each.
	require.GreaterOrEqual(t, b.stack.Source.Stats().ReportedFailures, int64(failing), "each failing message was reported failed")
}

// A poison message (an unknown currency) fails every delivery and ends in the DLQ while the rest
// flows; the operator adds the currency and redrives the DLQ; it is then applied once.
func TestPoisonMessageDLQFixedAndRedriven(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *localrun.StackOptions) { o.MaxReceiveCount = 2; o.VisibilityTimeout = 2 * time.Second })
	b.place(t, 40, 8, 5*time.Millisecond, nil)
	b.place(t, 1, 1, 0, func(_ int, o *demoapp.OrderCreated) { o.Customer, o.Currency = "poison", "XTS" })
	b.place(t, 40, 8, 5*time.Millisecond, nil)

	// Everything else is applied while the poison message fails its deliveries, and the poison
	// message ends in the DLQ.
	b.waitUntil(t, 90*time.Second, "everything but the poison message applied, and the poison message in the DLQ", func() (bool, string) {
		p, err := demoapp.ProgressOf(b.ctx, b.pool, b.prefix)
		require.NoError(t, err)
		depth, err := localrun.Depth(b.ctx, b.stack.SQS, b.stack.Pipeline.DLQURL)
		require.NoError(t, err)
		return p.Applied == b.written-1 && depth == 1, fmt.Sprintf("%d of %d applied, DLQ depth %d", p.Applied, b.written-1, depth)
	})
	var poisonApplied int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM demo_ledger WHERE customer = 'poison'`).Scan(&poisonApplied))
	require.Zero(t, poisonApplied)

	_, err := b.pool.Exec(b.ctx, `INSERT INTO demo_currencies (code) VALUES ('XTS')`)
	require.NoError(t, err)
	moved, err := localrun.Redrive(b.ctx, b.stack.SQS, b.stack.Pipeline.DLQURL, b.stack.Pipeline.QueueURL, b.stack.Pipeline.FIFO)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	b.waitApplied(t, 60*time.Second)
}
