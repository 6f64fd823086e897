package inbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

// convert makes the bundle's inbox a partitioned one with partitions of interval.
// It returns when new rows go to the partitions of interval (the former table's bound).
func (b *testBundle) convert(t *testing.T, interval time.Duration, ahead int) time.Time {
	t.Helper()
	plan, err := partition.Convert(context.Background(), b.pool, partition.Inbox, &partition.Options{Interval: interval, Ahead: ahead}, nil)
	require.NoError(t, err)
	bound, ok := partition.Inbox.Time(plan.Bound)
	require.True(t, ok)
	return bound
}

func recs(ids []string) []events.SQSMessage {
	out := make([]events.SQSMessage, len(ids))
	for i, id := range ids {
		out[i] = rec(id, script{N: i})
	}
	return out
}

// lateBegin begins each transaction, and with it fixes received_at (now() is the transaction's
// start), up to maxDelay before handing it to the consumer: two deliveries of one message that
// run at the same time then often carry received_at values in different partitions.
type lateBegin struct {
	pool     *pgxpool.Pool
	maxDelay time.Duration
}

func (l lateBegin) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := l.pool.Begin(ctx)
	if err == nil {
		time.Sleep(rand.N(l.maxDelay))
	}
	return tx, err
}

// On a partitioned inbox, deliveries of the same messages that run at the same time, in both
// commit modes, whose rows would land in different partitions, and redeliveries of messages
// stored in another partition (the former table), each apply a message exactly once: one
// effect and one inbox row per message, and no record fails.
func TestPartitionedInboxAppliesEachMessageOnceWithConcurrentDuplicatesAcrossPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	old := ids(10, "old")
	rep := newConsumer(t, b.pool, "billing", inbox.PerRecord).Process(ctx, batchOf(recs(old)...))
	require.Equal(t, 10, rep.Count(inbox.Applied))
	bound := b.convert(t, time.Second, 30)
	time.Sleep(time.Until(bound)) // new rows go to the 1-second partitions from here on

	fresh := ids(150, "new")
	all := append(append([]string{}, fresh...), old...)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []inbox.Result
	)
	// Every worker delivers the messages in the same order, so the 4 deliveries of a message
	// run at about the same time; a batch's transaction waits longer after BEGIN than a record's,
	// so that the batched workers do not run far ahead.
	for _, mode := range []inbox.Mode{inbox.PerRecord, inbox.PerRecord, inbox.Batched, inbox.Batched} {
		delay := 40 * time.Millisecond
		if mode == inbox.Batched {
			delay = 400 * time.Millisecond
		}
		c := newConsumer(t, lateBegin{pool: b.pool, maxDelay: delay}, "billing", mode)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < len(all); i += 10 {
				rep := c.Process(ctx, batchOf(recs(all[i:min(i+10, len(all))])...))
				mu.Lock()
				results = append(results, rep.Results...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	applied := map[string]int{}
	for _, r := range results {
		require.NotEqual(t, inbox.Failed, r.Outcome, "record %s failed: %v", r.MessageID, r.Err)
		if r.Outcome == inbox.Applied {
			applied[r.MessageID]++
		}
	}
	for _, id := range fresh {
		require.Equal(t, 1, applied[id], "message %s applied once among its 4 deliveries", id)
	}
	for _, id := range old {
		require.Zero(t, applied[id], "message %s, stored in the former table, is a duplicate", id)
	}
	require.Equal(t, len(all), count(t, b.pool, `SELECT count(*) FROM effect`), "one effect per message")
	require.Equal(t, len(all), count(t, b.pool, `SELECT count(DISTINCT message_id) FROM effect`))
	require.Equal(t, len(all), count(t, b.pool, `SELECT count(*) FROM inbox_event`), "one inbox row per message")
	require.GreaterOrEqual(t, count(t, b.pool, `SELECT count(DISTINCT tableoid) FROM inbox_event WHERE message_id LIKE 'new-%'`), 2,
		"the new messages' rows span several partitions")
}

// beginAt begins transactions, and so fixes their received_at, no earlier than at.
type beginAt struct {
	pool *pgxpool.Pool
	at   time.Time
}

func (b beginAt) Begin(ctx context.Context) (pgx.Tx, error) {
	time.Sleep(time.Until(b.at))
	return b.pool.Begin(ctx)
}

// The race a partitioned inbox must win, staged step by step: a first delivery stored its row
// and is running its handler (uncommitted) when a second delivery of the same message begins in
// the next partition, where no unique index can see the first row. The second waits for the
// message's lock, then finds the committed row: the message is applied once.
func TestDuplicateArrivingInTheNextPartitionWhileTheFirstIsInFlightIsNotApplied(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		ctx := context.Background()
		b := setup(t)
		bound := b.convert(t, time.Second, 30)
		time.Sleep(time.Until(bound))

		entered, gate := make(chan struct{}), make(chan struct{})
		slow := inbox.NewRouter(inbox.FailUnknown)
		slow.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
			if err := scripted("billing")(ctx, tx, msg); err != nil {
				return err
			}
			close(entered)
			<-gate
			return nil
		})
		first, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: slow, Mode: mode, Logger: quiet})
		require.NoError(t, err)
		var firstRep, secondRep inbox.Report
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			firstRep = first.Process(ctx, batchOf(rec("m", script{N: 1})))
		}()
		<-entered
		var next time.Time
		layout, err := partition.Read(ctx, b.pool, partition.Inbox)
		require.NoError(t, err)
		for _, p := range layout.Partitions {
			if from, ok := partition.Inbox.Time(p.From); ok && from.After(time.Now()) {
				next = from
				break
			}
		}
		require.False(t, next.IsZero())
		second := newConsumer(t, beginAt{pool: b.pool, at: next.Add(50 * time.Millisecond)}, "billing", mode)
		done := make(chan struct{})
		go func() {
			defer close(done)
			secondRep = second.Process(ctx, batchOf(rec("m", script{N: 1})))
		}()
		testwait.Until(t, "the second delivery waits for the message's lock", func() bool {
			select {
			case <-done:
				return true
			default:
			}
			return count(t, b.pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`) > 0
		})
		close(gate)
		wg.Wait()
		<-done
		require.Equal(t, inbox.Applied, firstRep.Results[0].Outcome, "%v", firstRep.Results[0].Err)
		require.Equal(t, inbox.Duplicate, secondRep.Results[0].Outcome, "%v", secondRep.Results[0].Err)
		require.Equal(t, []string{"billing/m/1"}, dbState(t, b.pool).Effects)
		require.Equal(t, 1, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE message_id = 'm'`))
	})
}

// A Consumer that ran on the plain inbox notices the conversion: its next insert fails once
// (nothing of that record commits, it comes back), then it deduplicates across partitions. The
// conversion keeps the inbox's grants and row-level security policies: a consumer's role still
// writes its own rows only.
func TestConsumerFollowsTheConversionAndPoliciesCarryOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	role := fmt.Sprintf("billing_%d", rand.N(1_000_000_000))
	for _, s := range []string{
		"CREATE ROLE " + role,
		"GRANT SELECT, INSERT, UPDATE ON TABLE inbox_event TO " + role,
		"GRANT SELECT, INSERT ON TABLE effect TO " + role,
		"ALTER TABLE inbox_event ENABLE ROW LEVEL SECURITY",
		"CREATE POLICY sluice_inbox_billing ON inbox_event TO " + role + " USING (consumer = 'billing') WITH CHECK (consumer = 'billing')",
	} {
		_, err := b.pool.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.WithoutCancel(ctx), "DROP OWNED BY "+role+"; DROP ROLE "+role)
	})
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+role)
		return err
	}
	asRole, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(asRole.Close)

	c := newConsumer(t, asRole, "billing", inbox.PerRecord)
	require.Equal(t, []string{"sqs-m1:applied"}, outcomes(c.Process(ctx, batchOf(rec("m1", script{N: 1})))))
	b.convert(t, 24*time.Hour, 2)

	rep := c.Process(ctx, batchOf(rec("m1", script{N: 1})))
	require.Equal(t, inbox.Failed, rep.Results[0].Outcome, "the plain insert fails once after the conversion")
	require.Equal(t, []string{"sqs-m1:duplicate", "sqs-m2:applied"}, outcomes(c.Process(ctx, batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2})))))
	require.Equal(t, []string{"sqs-m2:duplicate"}, outcomes(newConsumer(t, asRole, "billing", inbox.Batched).Process(ctx, batchOf(rec("m2", script{N: 2})))))
	require.Equal(t, []string{"billing/m1/1", "billing/m2/2"}, dbState(t, b.pool).Effects)

	other := newConsumer(t, asRole, "shipping", inbox.PerRecord).Process(ctx, batchOf(rec("m3", script{N: 3})))
	require.Equal(t, inbox.Failed, other.Results[0].Outcome)
	require.ErrorContains(t, other.Results[0].Err, "row-level security", "the role's policy still confines it to its consumer")
}

// A partitioned inbox refuses transactions that cannot see a concurrent delivery's row
// (REPEATABLE READ): the record fails and stores nothing.
func TestPartitionedInboxRefusesRepeatableReadTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.convert(t, 24*time.Hour, 2)
	rr := repeatableRead{b.pool}
	for _, mode := range modes {
		rep := newConsumer(t, rr, "billing", mode).Process(ctx, batchOf(rec("m-"+mode.String(), script{N: 1})))
		require.Equal(t, inbox.Failed, rep.Results[0].Outcome, mode.String())
		require.ErrorIs(t, rep.Results[0].Err, inbox.ErrInvalidConfig)
		require.ErrorContains(t, rep.Results[0].Err, "READ COMMITTED")
	}
	require.Zero(t, count(t, b.pool, `SELECT count(*) FROM inbox_event`))
	require.Zero(t, count(t, b.pool, `SELECT count(*) FROM effect`))
}

type repeatableRead struct{ pool *pgxpool.Pool }

func (r repeatableRead) Begin(ctx context.Context) (pgx.Tx, error) {
	return r.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
}

// The asynchronous inbox stores into a partitioned inbox_event and the Processor applies every
// stored message once, each FIFO group in arrival order.
func TestProcessorDrainsAPartitionedInbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.convert(t, 24*time.Hour, 2)
	var evs []events.SQSMessage
	for i := range 30 {
		evs = append(evs, fifo(rec(fmt.Sprintf("a-%02d", i), script{N: i}), fmt.Sprintf("g%d", i%3)))
	}
	c := newAsync(t, b, "billing")
	require.Equal(t, 30, c.Process(ctx, batchOf(evs...)).Count(inbox.Stored))
	require.Equal(t, 30, c.Process(ctx, batchOf(evs...)).Count(inbox.Duplicate))
	st, err := newProcessor(t, b, "billing", router("billing"), 3).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 30, st.Applied)
	require.Zero(t, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE processed_at IS NULL`))
	rows, err := b.pool.Query(ctx, `SELECT n FROM effect e JOIN inbox_event i USING (consumer, message_id) ORDER BY i.group_id, i.processed_at`)
	require.NoError(t, err)
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Len(t, ns, 30)
	for i := 1; i < len(ns); i++ {
		if ns[i]%3 == ns[i-1]%3 {
			require.Greater(t, ns[i], ns[i-1], "group g%d applied in arrival order", ns[i]%3)
		}
	}
}
