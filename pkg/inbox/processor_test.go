package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
)

func noBackoff(int) time.Duration { return 0 }

func newAsync(t *testing.T, b *testBundle, name string) *inbox.Consumer {
	t.Helper()
	c, err := inbox.New(b.pool, inbox.Config{Consumer: name, Mode: inbox.Async, Logger: quiet})
	require.NoError(t, err)
	return c
}

func newProcessor(t *testing.T, b *testBundle, name string, r *inbox.Router, maxAttempts int) *inbox.Processor {
	t.Helper()
	p, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: name, Router: r, MaxAttempts: maxAttempts, Backoff: noBackoff, Logger: quiet})
	require.NoError(t, err)
	return p
}

func TestAsyncStoresThenProcessorApplies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := newAsync(t, b, "billing")
	ev := loadEvent(t, "sqs_raw.json")
	ev.Records = append(ev.Records, rec("m1", script{N: 1}))
	rep := c.Process(ctx, ev)
	require.Equal(t, 3, rep.Count(inbox.Stored))
	require.Equal(t, 3, c.Process(ctx, ev).Count(inbox.Duplicate), "a redelivery is a duplicate of the stored row")
	require.Empty(t, dbState(t, b.pool).Effects, "the consumer applies nothing itself")

	st, err := inbox.Stats(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.Equal(t, "billing", st[0].Consumer)
	require.EqualValues(t, 3, st[0].Unprocessed)
	require.Zero(t, st[0].Parked)

	r := router("billing")
	var got []inbox.Message
	r.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error { got = append(got, msg); return nil })
	r.Handle("OrderCancelled", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error { got = append(got, msg); return nil })
	p := newProcessor(t, b, "billing", r, 3)
	stats, err := p.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Applied: 3}, stats)
	require.Equal(t, []string{"billing/m1/1"}, dbState(t, b.pool).Effects)
	require.Len(t, got, 2)
	require.Equal(t, "0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f4a5b", got[0].ID, "stored rows are applied in arrival order")
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", got[0].Traceparent(), "headers survive storage")
	require.Equal(t, time.Date(2026, 11, 29, 10, 40, 0, 123456000, time.UTC), got[0].CreatedAt)
	require.Equal(t, "ord-1001", got[0].AggregateID)
	require.JSONEq(t, ev.Records[0].Body, string(got[0].Payload))

	stats, err = p.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{}, stats, "nothing left")
	st, err = inbox.Stats(ctx, b.pool)
	require.NoError(t, err)
	require.Empty(t, st)
}

func TestProcessorRetriesParksAndOperatorRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := newAsync(t, b, "billing")
	c.Process(ctx, batchOf(rec("good", script{N: 1}), rec("bad", script{N: 2, Fail: "error"}), rec("boom", script{N: 3, Fail: "panic"})))

	p := newProcessor(t, b, "billing", router("billing"), 3)
	var total inbox.ProcessStats
	for range 5 {
		st, err := p.Drain(ctx)
		require.NoError(t, err)
		total.Applied += st.Applied
		total.Failed += st.Failed
		total.Parked += st.Parked
	}
	require.Equal(t, inbox.ProcessStats{Applied: 1, Failed: 6, Parked: 2}, total, "two rows fail 3 times each, then stay parked")
	require.Equal(t, []string{"billing/good/1"}, dbState(t, b.pool).Effects, "failed attempts leave no effect")

	parked, err := inbox.ListParked(ctx, b.pool, "billing", 0)
	require.NoError(t, err)
	require.Len(t, parked, 2)
	byID := map[string]inbox.ParkedEvent{}
	for _, e := range parked {
		byID[e.MessageID] = e
	}
	require.Equal(t, 3, byID["bad"].Attempts)
	require.Contains(t, byID["bad"].LastError, "scripted failure")
	require.Contains(t, byID["boom"].LastError, "handler panicked")
	require.JSONEq(t, `{"n":2,"fail":"error"}`, string(byID["bad"].Payload))
	require.False(t, byID["bad"].ParkedAt.IsZero())

	st, err := inbox.Stats(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []inbox.ConsumerStatus{{Consumer: "billing", Parked: 2}}, st)

	// The operator fixes the cause (here: the handler) and retries one row.
	fixed := inbox.NewRouter(inbox.FailUnknown)
	fixed.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ('billing', $1, 0)`, msg.ID)
		return err
	})
	n, err := inbox.RetryParked(ctx, b.pool, "billing", "bad", "no-such-id")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	st2, err := newProcessor(t, b, "billing", fixed, 3).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Applied: 1}, st2)

	n, err = inbox.RetryParked(ctx, b.pool, "billing") // all the rest
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = newProcessor(t, b, "billing", fixed, 3).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"billing/bad/0", "billing/boom/0", "billing/good/1"}, dbState(t, b.pool).Effects)
	require.Equal(t, 0, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE processed_at IS NULL`))
	require.Equal(t, 0, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE last_error IS NOT NULL`))

	_, err = inbox.RetryParked(ctx, b.pool, "")
	require.ErrorIs(t, err, inbox.ErrInvalidArgument)
}

func TestProcessorBackoffDefersRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	newAsync(t, b, "c").Process(ctx, batchOf(rec("bad", script{N: 1, Fail: "error"})))
	p, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "c", Router: router("c"), Logger: quiet})
	require.NoError(t, err)
	st, err := p.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Failed: 1}, st)
	st, err = p.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{}, st, "the row waits for its backoff")
	require.Equal(t, 1, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE next_attempt_at > now() AND attempts = 1`))
	require.Equal(t, time.Second, inbox.DefaultBackoff(1))
	require.Equal(t, 5*time.Minute, inbox.DefaultBackoff(50))
}

func TestConcurrentProcessorsApplyOnceAndKeepGroupOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 200
	recs := batchOf()
	for i, id := range ids(n, "m") {
		r := rec(id, script{N: i})
		if i%2 == 0 {
			r = fifo(r, []string{"A", "B", "C"}[i%3])
		}
		recs.Records = append(recs.Records, r)
	}
	require.Equal(t, n, newAsync(t, b, "c").Process(ctx, recs).Count(inbox.Stored))

	// Each handler appends to a per-group sequence; order violations are detected in the database.
	r := inbox.NewRouter(inbox.FailUnknown)
	var mu sync.Mutex
	lastByGroup := map[string]int{}
	var violations []string
	r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		s, err := inbox.Decode[script](msg)
		if err != nil {
			return err
		}
		if msg.GroupID != "" {
			mu.Lock()
			if last, ok := lastByGroup[msg.GroupID]; ok && last > s.N {
				violations = append(violations, msg.ID)
			}
			lastByGroup[msg.GroupID] = s.N
			mu.Unlock()
		}
		_, err = tx.Exec(ctx, `INSERT INTO effect VALUES ('c', $1, $2)`, msg.ID, s.N)
		return err
	})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		p := newProcessor(t, b, "c", r, 3)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = p.Drain(ctx)
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, n, count(t, b.pool, `SELECT count(*) FROM effect`))
	require.Equal(t, n, count(t, b.pool, `SELECT count(DISTINCT message_id) FROM effect`), "no row applied twice")
	require.Empty(t, violations, "a message group is applied in arrival order")
}

func TestParkedRowBlocksItsGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	newAsync(t, b, "c").Process(ctx, batchOf(
		fifo(rec("a1", script{N: 1, Fail: "error"}), "A"),
		fifo(rec("a2", script{N: 2}), "A"),
		fifo(rec("b1", script{N: 1}), "B"),
	))
	st, err := newProcessor(t, b, "c", router("c"), 1).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Applied: 1, Failed: 1, Parked: 1}, st)
	require.Equal(t, []string{"c/b1/1"}, dbState(t, b.pool).Effects, "a2 waits behind parked a1")
}

func TestProcessorUnknownPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	msg := record("sqs-u", `{}`, map[string]string{"messageId": "u1", "eventType": "Nobody"})
	newAsync(t, b, "strict").Process(ctx, batchOf(msg))
	newAsync(t, b, "lenient").Process(ctx, batchOf(msg))

	st, err := newProcessor(t, b, "strict", inbox.NewRouter(inbox.FailUnknown), 1).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Failed: 1, Parked: 1}, st)
	st, err = newProcessor(t, b, "lenient", inbox.NewRouter(inbox.SkipUnknown), 1).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Skipped: 1}, st)
	require.Equal(t, []string{"lenient/u1/true", "strict/u1/false"}, dbState(t, b.pool).Inbox)
}

func TestProcessorConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Router: router("c")})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	_, err = inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "c"})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	_, err = inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "c", Router: router("c"), MaxAttempts: -1})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	require.Equal(t, inbox.DefaultMaxAttempts, inbox.ProcessorConfig{}.WithDefaults().MaxAttempts)
}

func TestProcessorRunStopsWithContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	newAsync(t, b, "c").Process(context.Background(), batchOf(rec("m1", script{N: 1})))
	p, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "c", Router: router("c"), PollInterval: 20 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, p.Run(ctx), context.DeadlineExceeded)
	require.Equal(t, []string{"c/m1/1"}, dbState(t, b.pool).Effects)
}
