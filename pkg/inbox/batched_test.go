package inbox_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
)

// Concurrent batches that deliver the same message ids in opposite orders: the batched mode
// inserts a batch's inbox rows sorted by key, so the batches wait for each other instead of
// deadlocking (40P01), and every message is applied once.
func TestBatchedConcurrentSharedIDsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		time.Sleep(20 * time.Millisecond) // hold the inbox keys while the other batches arrive
		return scripted("billing")(ctx, tx, msg)
	})
	const instances = 4
	var (
		wg   sync.WaitGroup
		reps = make([]inbox.Report, instances)
	)
	for i := range instances {
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: r, Mode: inbox.Batched, Logger: quiet})
		require.NoError(t, err)
		recs := []events.SQSMessage{rec("m1", script{N: 1}), rec("m2", script{N: 2}), rec("m3", script{N: 3}), rec("m4", script{N: 4})}
		if i%2 == 1 {
			slices.Reverse(recs)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			reps[i] = c.Process(context.Background(), batchOf(recs...))
		}()
	}
	wg.Wait()
	applied := 0
	for _, rep := range reps {
		for _, res := range rep.Results {
			require.NotEqual(t, inbox.Failed, res.Outcome, "%v", res.Err)
			if res.Outcome == inbox.Applied {
				applied++
			}
		}
	}
	require.Equal(t, 4, applied)
	require.Equal(t, []string{"billing/m1/1", "billing/m2/2", "billing/m3/3", "billing/m4/4"}, dbState(t, b.pool).Effects)
}

// After a handler fails, the batched mode rolls back and applies the batch again with a
// savepoint per record: the handlers before the failure run again, their effects commit once,
// and the records after it run once.
func TestBatchedRetriesWithSavepointsAfterAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls sync.Map
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		n, _ := calls.LoadOrStore(msg.ID, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return scripted("c")(ctx, tx, msg)
	})
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: r, Mode: inbox.Batched, Logger: quiet})
	require.NoError(t, err)
	rep := c.Process(context.Background(), batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2, Fail: "error"}), rec("m3", script{N: 3})))
	require.Equal(t, []string{"sqs-m1:applied", "sqs-m2:failed", "sqs-m3:applied"}, outcomes(rep))
	got := map[string]int32{}
	calls.Range(func(k, v any) bool { got[k.(string)] = v.(*atomic.Int32).Load(); return true })
	require.Equal(t, map[string]int32{"m1": 2, "m2": 2, "m3": 1}, got)
	require.Equal(t, state{
		Inbox:   []string{"c/m1/true", "c/m3/true"},
		Effects: []string{"c/m1/1", "c/m3/3"},
	}, dbState(t, b.pool))
}

// A handler that swallows a failed statement and returns nil leaves the transaction aborted.
// In both modes only that record fails (it is reported in BatchItemFailures, so SQS delivers it
// again and moves it to the DLQ after maxReceiveCount); in the batched mode the others still
// commit.
func TestSwallowedStatementErrorFailsOnlyItsRecord(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		r := inbox.NewRouter(inbox.FailUnknown)
		r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
			if err := scripted("c")(ctx, tx, msg); err != nil {
				return err
			}
			if msg.ID == "m2" {
				_, _ = tx.Exec(ctx, `SELECT 1/0`) // error ignored: the transaction is aborted
			}
			return nil
		})
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: r, Mode: mode, Logger: quiet})
		require.NoError(t, err)
		for _, ev := range []events.SQSEvent{
			batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2}), rec("m3", script{N: 3})),
			batchOf(rec("m4", script{N: 4}), rec("m2", script{N: 2})), // the culprit last
		} {
			rep := c.Process(context.Background(), ev)
			for _, res := range rep.Results {
				if res.MessageID == "m2" {
					require.Equal(t, inbox.Failed, res.Outcome)
					require.ErrorContains(t, res.Err, "handler returned nil after a failed statement")
					require.Contains(t, failedIDs(rep.Response()), "sqs-m2")
				} else {
					require.Equal(t, inbox.Applied, res.Outcome, "%v", res.Err)
				}
			}
		}
		require.Equal(t, state{
			Inbox:   []string{"c/m1/true", "c/m3/true", "c/m4/true"},
			Effects: []string{"c/m1/1", "c/m3/3", "c/m4/4"},
		}, dbState(t, b.pool))
	})
}

// With StorePayload, a payload PostgreSQL cannot store fails the batch's one insert; the batched
// mode then inserts record by record, so only that record fails, as in the per-record mode.
func TestUnstorablePayloadFailsAloneInBothModes(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: router("c"), Mode: mode, StorePayload: true, Logger: quiet})
		require.NoError(t, err)
		bad := record("sqs-bad", "{\"n\":7,\"s\":\"\xff\"}", map[string]string{"messageId": "bad", "eventType": "Scripted"}) // not UTF-8
		rep := c.Process(context.Background(), batchOf(rec("m1", script{N: 1}), bad, rec("m2", script{N: 2})))
		require.Equal(t, []string{"sqs-m1:applied", "sqs-bad:failed", "sqs-m2:applied"}, outcomes(rep))
		require.ErrorIs(t, rep.Results[1].Err, inbox.ErrBadMessage)
		require.Equal(t, state{
			Inbox:   []string{"c/m1/true", "c/m2/true"},
			Effects: []string{"c/m1/1", "c/m2/2"},
		}, dbState(t, b.pool))
		require.Equal(t, 2, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE payload IS NOT NULL`))
	})
}

// The batched mode's fallback (record by record, after the batch insert failed) fails a handler
// that swallowed a failed statement alone too, as the per-record mode does.
func TestSwallowedStatementErrorInTheRecordByRecordFallback(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: router("c"), Mode: mode, StorePayload: true, Logger: quiet})
		require.NoError(t, err)
		bad := record("sqs-bad", "{\"n\":7,\"s\":\"\xff\"}", map[string]string{"messageId": "bad", "eventType": "Scripted"}) // not UTF-8
		rep := c.Process(context.Background(), batchOf(rec("m1", script{N: 1}), bad, rec("m2", script{N: 2, Fail: "swallow"}), rec("m3", script{N: 3})))
		require.Equal(t, []string{"sqs-m1:applied", "sqs-bad:failed", "sqs-m2:failed", "sqs-m3:applied"}, outcomes(rep))
		require.ErrorContains(t, rep.Results[2].Err, "message m2 (Scripted): handler: handler returned nil after a failed statement")
		require.Equal(t, state{
			Inbox:   []string{"c/m1/true", "c/m3/true"},
			Effects: []string{"c/m1/1", "c/m3/3"},
		}, dbState(t, b.pool))
	})
}
