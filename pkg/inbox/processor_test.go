package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/inbox"
)

func noBackoff(int) time.Duration { return 0 }

func newAsync(t *testing.T, b *testBundle, name string) *inbox.Consumer {
	t.Helper()
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: name, Mode: inbox.Async, Logger: quiet})
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

	st, err := inbox.LagOf(ctx, b.pool)
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
	st, err = inbox.LagOf(ctx, b.pool)
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

	st, err := inbox.LagOf(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, []inbox.Lag{{Consumer: "billing", Parked: 2}}, st)

	// The operator fixes the cause (here: the handler) and retries one row.
	fixed := inbox.NewRouter(inbox.FailUnknown)
	fixed.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ('billing', $1, 0)`, msg.ID)
		return err
	})
	n, err := inbox.RetryParked(ctx, b.pool, "billing", []string{"bad", "no-such-id"})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	st2, err := newProcessor(t, b, "billing", fixed, 3).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Applied: 1}, st2)

	_, err = inbox.RetryParked(ctx, b.pool, "billing", nil)
	require.ErrorIs(t, err, inbox.ErrNothingSelected, "no ids is not all ids")
	n, err = inbox.RetryAllParked(ctx, b.pool, "billing") // all the rest
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = newProcessor(t, b, "billing", fixed, 3).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"billing/bad/0", "billing/boom/0", "billing/good/1"}, dbState(t, b.pool).Effects)
	require.Equal(t, 0, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE processed_at IS NULL`))
	require.Equal(t, 0, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE last_error IS NOT NULL`))

	_, err = inbox.RetryParked(ctx, b.pool, "", []string{"bad"})
	require.ErrorIs(t, err, inbox.ErrInvalidArgument)
	_, err = inbox.RetryAllParked(ctx, b.pool, "")
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

// Several processors drain one consumer at once, with batches smaller than, about as large as,
// and larger than the backlog: every row is applied once and each FIFO group in arrival order.
func TestConcurrentProcessorsApplyOnceAndKeepGroupOrder(t *testing.T) {
	t.Parallel()
	for _, batchSize := range []int{1, 7, inbox.DefaultBatchSize} {
		t.Run(fmt.Sprintf("batch %d", batchSize), func(t *testing.T) {
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
				p, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "c", Router: r, MaxAttempts: 3,
					Backoff: noBackoff, BatchSize: batchSize, Logger: quiet})
				require.NoError(t, err)
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = p.Drain(ctx)
				}()
			}
			wg.Wait()
			require.NoError(t, errors.Join(errs...))
			// A processor stops early only when what is left is being applied by the others, so
			// the last one to stop leaves nothing behind.
			require.Equal(t, n, count(t, b.pool, `SELECT count(*) FROM effect`))
			require.Equal(t, n, count(t, b.pool, `SELECT count(DISTINCT message_id) FROM effect`), "no row applied twice")
			require.Empty(t, violations, "a message group is applied in arrival order")
			st, err := newProcessor(t, b, "c", r, 3).Drain(ctx)
			require.NoError(t, err)
			require.Equal(t, inbox.ProcessStats{}, st)
		})
	}
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	testwait.Until(t, "the processor applies m1", func() bool { return len(dbState(t, b.pool).Effects) > 0 })
	cancel()
	require.ErrorIs(t, testwait.Receive(t, "Run returns once its context ends", done), context.Canceled)
	require.Equal(t, []string{"c/m1/1"}, dbState(t, b.pool).Effects)
}

// Issue 10, scenario 12: a handler that ignores a failed statement and returns nil leaves its
// transaction aborted, and a commit can fail on its own (a deferred constraint). Neither may
// stall the Processor: the attempt rolls back whole, the failure is recorded by a statement of
// its own, the row is retried and parked after MaxAttempts, and every other row is applied.
func TestProcessorParksRowsWhoseCommitFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE parent (id int PRIMARY KEY);
		CREATE TABLE child (parent int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	r := router("c")
	r.Handle("Orphan", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO child VALUES (42)`) // fails only at COMMIT
		return err
	})
	orphan := record("sqs-orphan", `{}`, map[string]string{"messageId": "orphan", "eventType": "Orphan"})
	require.Equal(t, 7, newAsync(t, b, "c").Process(ctx, batchOf(
		rec("m1", script{N: 1}),
		rec("m2", script{N: 2, Fail: "swallow"}),
		orphan,
		rec("m3", script{N: 3}),
		fifo(rec("a1", script{N: 1, Fail: "swallow"}), "A"),
		fifo(rec("a2", script{N: 2}), "A"), // waits behind a1, which is parked
		fifo(rec("b1", script{N: 1}), "B"),
	)).Count(inbox.Stored))

	st, err := newProcessor(t, b, "c", r, 3).Drain(ctx)
	require.NoError(t, err, "the processor does not stop")
	require.Equal(t, inbox.ProcessStats{Applied: 3, Failed: 9, Parked: 3}, st)
	require.Equal(t, []string{"c/b1/1", "c/m1/1", "c/m3/3"}, dbState(t, b.pool).Effects, "failed attempts leave no effect")

	parked, err := inbox.ListParked(ctx, b.pool, "c", 0)
	require.NoError(t, err)
	byID := map[string]inbox.ParkedEvent{}
	for _, e := range parked {
		byID[e.MessageID] = e
	}
	require.Len(t, byID, 3)
	for _, id := range []string{"m2", "a1"} {
		require.Equal(t, 3, byID[id].Attempts, id)
		require.Contains(t, byID[id].LastError, "handler returned nil after a failed statement", id)
	}
	require.Equal(t, 3, byID["orphan"].Attempts)
	require.Contains(t, byID["orphan"].LastError, inbox.ErrCommit.Error())
	require.Equal(t, 1, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE message_id = 'a2' AND processed_at IS NULL AND parked_at IS NULL AND attempts = 0`),
		"a2 was never attempted: its group waits for an operator")
}

// Issue 10, scenario 11: error text is cut on a character boundary and cleaned of NUL bytes
// before it is written to last_error, wherever the cut falls.
func TestProcessorStoresAnyHandlerErrorText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Fail", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		// The stored text starts with "message <id> (Fail): handler: "; the padding moves the
		// 4,000-byte cut to each byte of a four-byte character.
		pad := strings.Repeat("x", len(msg.ID)%4)
		return errors.New("nul\x00byte, bad \xff byte, " + pad + strings.Repeat("😀", 1200))
	})
	var recs []events.SQSMessage
	for _, id := range []string{"e0", "e01", "e012", "e0123"} {
		recs = append(recs, record("sqs-"+id, `{}`, map[string]string{"messageId": id, "eventType": "Fail"}))
	}
	newAsync(t, b, "c").Process(ctx, batchOf(recs...))

	st, err := newProcessor(t, b, "c", r, 1).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Failed: 4, Parked: 4}, st)
	parked, err := inbox.ListParked(ctx, b.pool, "c", 0)
	require.NoError(t, err)
	require.Len(t, parked, 4)
	for _, e := range parked {
		require.True(t, utf8.ValidString(e.LastError), e.MessageID)
		require.NotContains(t, e.LastError, "\x00")
		require.Contains(t, e.LastError, "nul\uFFFDbyte, bad \uFFFD byte")
		require.True(t, strings.HasSuffix(e.LastError, "😀..."), "%s: cut after a whole character", e.MessageID)
		require.LessOrEqual(t, len(e.LastError), 4000+len("..."))
	}
}

// Issue 10, scenario 12: a parked FIFO group with 50,000 rows behind it costs the other groups
// nothing. The claim's buffer accesses (EXPLAIN ANALYZE) stay under a bound that does not grow
// with the 50,000 rows, with statistics taken before the backlog existed (the planner believes
// nothing is waiting) and with fresh ones, as a custom and as a generic plan; then every other
// row is applied.
func TestParkedGroupBacklogDoesNotSlowOtherGroups(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// Retained history, analyzed while nothing waits: the statistics a quiet inbox has.
	_, err := b.pool.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, group_id, payload, processed_at)
		SELECT 'c', 'old-' || i, 'Scripted', 'G' || (i % 100), '{"n":0}', now() FROM generate_series(1, 20000) i`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `ANALYZE inbox_event`)
	require.NoError(t, err)

	// Group "A" (first in index order) fails at its head and is parked ...
	c := newAsync(t, b, "c")
	c.Process(ctx, batchOf(fifo(rec("a-head", script{N: 0, Fail: "error"}), "A")))
	st, err := newProcessor(t, b, "c", router("c"), 1).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Failed: 1, Parked: 1}, st)
	// ... and 50,000 rows arrive behind it, stored as the async consumer stores them.
	_, err = b.pool.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, group_id, payload)
		SELECT 'c', 'a-' || i, 'Scripted', 'A', '{"n":1}' FROM generate_series(1, 50000) i`)
	require.NoError(t, err)
	// Then 20 other groups with 5 rows each and 10 rows without a group.
	var others []events.SQSMessage
	for g := range 20 {
		for i := range 5 {
			others = append(others, fifo(rec(fmt.Sprintf("g%02d-%d", g, i), script{N: i}), fmt.Sprintf("G%02d", g)))
		}
	}
	for i := range 10 {
		others = append(others, rec(fmt.Sprintf("s-%d", i), script{N: i}))
	}
	require.Equal(t, 110, c.Process(ctx, batchOf(others...)).Count(inbox.Stored))

	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `PREPARE claim(text, text, int) AS `+inbox.ClaimSQL)
	require.NoError(t, err)
	defer conn.Exec(context.WithoutCancel(ctx), `DEALLOCATE claim`) //nolint:errcheck
	// At most this many buffer accesses per row the claim returns, plus a constant: the claim
	// reads about one per row (the 5 rows of a group share a leaf page). Reading only the index
	// entries of the rows behind the parked head would take about 250 more; reading those rows,
	// as the former claim did, about 200,000 for one row.
	const perRow, constant = 2, 40
	explain := func(stats string) {
		t.Helper()
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			_, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode)
			require.NoError(t, err)
			var out []map[string]any
			require.NoError(t, conn.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim('c', '', 100)`).Scan(&out))
			plan := out[0]["Plan"].(map[string]any)
			rows := plan["Actual Rows"].(float64)
			buffers := plan["Shared Hit Blocks"].(float64) + plan["Shared Read Blocks"].(float64)
			t.Logf("%s statistics, %s: %v rows, %v buffers", stats, mode, rows, buffers)
			require.EqualValues(t, 110, rows, "the claim returns the other groups' rows (5 from each of 20 groups) and the 10 without a group")
			require.LessOrEqual(t, buffers, perRow*rows+constant, "%s statistics, %s", stats, mode)
		}
		_, err := conn.Exec(ctx, `RESET plan_cache_mode`)
		require.NoError(t, err)
	}
	explain("stale")
	_, err = b.pool.Exec(ctx, `ANALYZE inbox_event`)
	require.NoError(t, err)
	explain("fresh")

	// Locking a claimed row reads it and its group's index range, not the table.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	var out []map[string]any
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+inbox.LockSQL, "c", "g07-0", 0).Scan(&out))
	plan := out[0]["Plan"].(map[string]any)
	require.EqualValues(t, 1, plan["Actual Rows"])
	lockBuffers := plan["Shared Hit Blocks"].(float64) + plan["Shared Read Blocks"].(float64)
	t.Logf("lock: %v buffers", lockBuffers)
	require.LessOrEqual(t, lockBuffers, float64(20))
	require.NoError(t, tx.Rollback(ctx))

	st, err = newProcessor(t, b, "c", router("c"), 1).Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Applied: 110}, st, "every other row is applied")
	require.Equal(t, 50001, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE group_id = 'A' AND processed_at IS NULL`), "group A waits for an operator")
}

// queryCounter counts the statements a Processor sends through Query: its claims.
type queryCounter struct {
	*pgxpool.Pool
	queries atomic.Int32
}

func (q *queryCounter) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	q.queries.Add(1)
	return q.Pool.Query(ctx, sql, args...)
}

// The Processor claims rows in batches, not one per query, also for a single FIFO group, and
// FIFO groups take turns: a group with a backlog delays another group by at most one batch.
func TestProcessorClaimsInBatchesAndGroupsTakeTurns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var recs []events.SQSMessage
	for i := range 300 {
		recs = append(recs, fifo(rec(fmt.Sprintf("a%03d", i), script{N: i}), "A"))
	}
	for i := range 200 {
		recs = append(recs, rec(fmt.Sprintf("s%03d", i), script{N: i}))
	}
	recs = append(recs, fifo(rec("b000", script{N: 0}), "B"), fifo(rec("c000", script{N: 0}), "C"))
	require.Equal(t, len(recs), newAsync(t, b, "c").Process(ctx, batchOf(recs...)).Count(inbox.Stored))

	var order []string
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		order = append(order, msg.ID)
		return scripted("c")(ctx, tx, msg)
	})
	db := &queryCounter{Pool: b.pool}
	p, err := inbox.NewProcessor(db, inbox.ProcessorConfig{Consumer: "c", Router: r, BatchSize: 50, Backoff: noBackoff, Logger: quiet})
	require.NoError(t, err)
	st, err := p.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, inbox.ProcessStats{Applied: len(recs)}, st)
	// 502 rows in batches of 50. Each batch of A's rows is followed by a claim for the groups
	// after A (that is how groups take turns), and the last claim finds nothing: 13. One row
	// per claim would be 502.
	require.LessOrEqual(t, db.queries.Load(), int32(2*(len(recs)/50+1)+1))

	pos := map[string]int{}
	var a []string
	for i, id := range order {
		pos[id] = i
		if strings.HasPrefix(id, "a") {
			a = append(a, id)
		}
	}
	require.True(t, slices.IsSorted(a), "group A in arrival order")
	require.Less(t, pos["b000"], pos["a100"], "B does not wait for A's backlog")
	require.Less(t, pos["c000"], pos["a100"], "C does not wait for A's backlog")
}
