package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
)

const testQueue = "arn:aws:sqs:eu-west-1:123456789012:billing"

// fixedRouter is the scripted handler after its fix: it writes its effect and never fails.
func fixedRouter(consumer string) *inbox.Router {
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		s, err := inbox.Decode[script](msg)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO effect VALUES ($1, $2, $3)`, consumer, msg.ID, s.N)
		return err
	})
	return r
}

// received is r as SQS delivers it for the n-th time from the queue.
func received(r events.SQSMessage, n int) events.SQSMessage {
	r.EventSourceARN = testQueue
	attrs := map[string]string{}
	for k, v := range r.Attributes {
		attrs[k] = v
	}
	attrs["ApproximateReceiveCount"] = fmt.Sprint(n)
	r.Attributes = attrs
	return r
}

func deadLetters(t *testing.T, db inbox.Querier, consumer string, includeApplied bool) []inbox.DeadLetter {
	t.Helper()
	out, err := inbox.ListDeadLetters(context.Background(), db, inbox.DeadLetterFilter{Consumer: consumer, IncludeApplied: includeApplied})
	require.NoError(t, err)
	return out
}

// A record that fails through its own fault is kept with its reason at each failure; the
// receive SQS makes last (MaxReceiveCount) marks it dead. Records that succeed, and records
// not attempted (blocked behind a failure of their FIFO group), leave no dead letter.
func TestDeadLetterKeepsWhySQS(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		if mode == inbox.Async {
			return // stores without running handlers: nothing fails through the handler
		}
		b := setup(t)
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: router("billing"), Mode: mode,
			SQSMaxReceiveCount: 3, Logger: quiet})
		require.NoError(t, err)
		poison := fifo(rec("p1", script{N: 1, Fail: "error"}), "g")
		behind := fifo(rec("p2", script{N: 2}), "g")
		fine := rec("ok", script{N: 3})
		var first time.Time
		for n := 1; n <= 3; n++ {
			rep := c.Process(context.Background(), batchOf(received(poison, n), received(behind, n), received(fine, n)))
			fineOutcome := inbox.Duplicate
			if n == 1 {
				fineOutcome = inbox.Applied
			}
			require.Equal(t, []inbox.Outcome{inbox.Failed, inbox.Failed, fineOutcome},
				[]inbox.Outcome{rep.Results[0].Outcome, rep.Results[1].Outcome, rep.Results[2].Outcome})
			require.Equal(t, n == 3, rep.Results[0].Dead, "dead on the receive before the DLQ, not before")
			require.False(t, rep.Results[1].Dead)
			dl := deadLetters(t, b.pool, "billing", false)
			require.Len(t, dl, 1, "only the record that failed through its own fault")
			d := dl[0]
			require.Equal(t, "p1", d.Key)
			require.Equal(t, "p1", d.MessageID)
			require.Equal(t, "Scripted", d.EventType)
			require.Equal(t, "g", d.GroupID)
			require.Equal(t, "aws:sqs", d.Source)
			require.Equal(t, testQueue, d.SourceName)
			require.Equal(t, "sqs-p1", d.SourcePosition)
			require.Equal(t, n, d.ReceiveCount)
			require.Equal(t, n, d.Attempts)
			require.Equal(t, inbox.ClassHandler, d.ErrorClass)
			require.Contains(t, d.Error, "scripted failure")
			require.Equal(t, "*errors.errorString", d.ErrorChain[len(d.ErrorChain)-1].Type)
			require.Equal(t, "scripted failure", d.ErrorChain[len(d.ErrorChain)-1].Text)
			require.JSONEq(t, `{"n":1,"fail":"error"}`, d.Payload)
			if n == 1 {
				first = d.FirstFailedAt
			}
			require.Equal(t, first, d.FirstFailedAt, "the first failure is kept")
			require.False(t, d.LastFailedAt.Before(d.FirstFailedAt))
			want := inbox.DeadFailing
			if n == 3 {
				want = inbox.DeadDead
				require.NotNil(t, d.DeadAt)
			}
			require.Equal(t, want, d.State)
		}
		require.Equal(t, []string{"billing/ok/3"}, dbState(t, b.pool).Effects, "the failed record's effects rolled back")
	})
}

// The error class names the kind of failure: a panic, an event type nobody handles, a body
// that is not a message (kept raw, under its place in the queue, and not retryable).
func TestDeadLetterClasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: router("billing"), SQSMaxReceiveCount: 1, Logger: quiet})
	require.NoError(t, err)
	unknown := rec("u1", script{N: 1})
	unknown.MessageAttributes["eventType"] = events.SQSMessageAttribute{DataType: "String", StringValue: ptr("Nobody")}
	garbage := record("sqs-garbage", "not json at all", nil)
	rep := c.Process(context.Background(), batchOf(received(rec("x1", script{N: 1, Fail: "panic"}), 1), received(unknown, 1), received(garbage, 1)))
	require.Equal(t, 3, rep.Count(inbox.Failed))
	byKey := map[string]inbox.DeadLetter{}
	for _, d := range deadLetters(t, b.pool, "billing", false) {
		byKey[d.Key] = d
		require.Equal(t, inbox.DeadDead, d.State, "MaxReceiveCount 1: the first receive is the last")
	}
	require.Equal(t, inbox.ClassHandlerPanic, byKey["x1"].ErrorClass)
	require.Equal(t, inbox.ClassUnknownEventType, byKey["u1"].ErrorClass)
	g := byKey[testQueue+"/sqs-garbage"]
	require.Equal(t, inbox.ClassBadMessage, g.ErrorClass)
	require.Empty(t, g.MessageID)
	require.Equal(t, "not json at all", g.Payload)

	_, err = inbox.RetryDeadLetters(context.Background(), b.pool, "billing", []string{g.Key, "x1"})
	require.ErrorIs(t, err, inbox.ErrNotRetryable)
	require.Empty(t, dbState(t, b.pool).Inbox, "a refused retry changes nothing")
	_, err = inbox.RetryDeadLetters(context.Background(), b.pool, "billing", []string{"x1", "nope"})
	require.ErrorIs(t, err, inbox.ErrInvalidArgument)
	require.ErrorContains(t, err, "nope")
	require.Empty(t, dbState(t, b.pool).Inbox)
}

func ptr[T any](v T) *T { return &v }

// The proof of item 1: a poison message is dead after its last receive; the handler is fixed;
// retrying the dead letter applies it once through the processor; the DLQ copy redriven too
// applies nothing more. And the other order: the redriven copy applied first, the retry then
// finds it in the inbox and changes nothing.
func TestDeadLetterRetryAppliesOnce(t *testing.T) {
	t.Parallel()
	for _, redriveFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("redrive first %v", redriveFirst), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			broken, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: router("billing"), SQSMaxReceiveCount: 2, Logger: quiet})
			require.NoError(t, err)
			poison := rec("p1", script{N: 7, Fail: "error"})
			for n := 1; n <= 2; n++ {
				broken.Process(ctx, batchOf(received(poison, n)))
			}
			require.Equal(t, inbox.DeadDead, deadLetters(t, b.pool, "billing", false)[0].State)
			requireDeadCount(t, b.pool, inbox.DeadDead)

			// The fix: the handler no longer fails on this payload.
			fixed, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: fixedRouter("billing"), Logger: quiet})
			require.NoError(t, err)
			proc, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "billing", Router: fixedRouter("billing"), Logger: quiet})
			require.NoError(t, err)
			redrive := func() {
				rep := fixed.Process(ctx, batchOf(received(poison, 1))) // a redriven copy starts its receives again
				require.Equal(t, 0, rep.Count(inbox.Failed))
			}
			if redriveFirst {
				redrive()
				require.Equal(t, inbox.DeadApplied, deadLetters(t, b.pool, "billing", true)[0].State)
			}
			res, err := inbox.RetryDeadLetters(ctx, b.pool, "billing", []string{"p1"})
			require.NoError(t, err)
			if redriveFirst {
				require.Equal(t, inbox.DeadLetterRetry{AlreadyInInbox: []string{"p1"}}, res)
			} else {
				require.Equal(t, inbox.DeadLetterRetry{Stored: []string{"p1"}}, res)
				require.Equal(t, inbox.DeadRetrying, deadLetters(t, b.pool, "billing", false)[0].State)
				requireDeadCount(t, b.pool, inbox.DeadRetrying)
				st, err := proc.Drain(ctx)
				require.NoError(t, err)
				require.Equal(t, 1, st.Applied)
				redrive() // the DLQ copy too: a duplicate
				res, err = inbox.RetryDeadLetters(ctx, b.pool, "billing", []string{"p1"})
				require.NoError(t, err)
				require.Equal(t, inbox.DeadLetterRetry{AlreadyInInbox: []string{"p1"}}, res, "retried twice: still once")
			}
			st, err := proc.Drain(ctx)
			require.NoError(t, err)
			require.Zero(t, st.Applied)
			require.Equal(t, []string{"billing/p1/7"}, dbState(t, b.pool).Effects, "applied exactly once")
			require.Empty(t, deadLetters(t, b.pool, "billing", false), "an applied dead letter is not listed by default")
			all := deadLetters(t, b.pool, "billing", true)
			require.Len(t, all, 1)
			require.Equal(t, inbox.DeadApplied, all[0].State)
			requireDeadCount(t, b.pool, inbox.DeadApplied)
		})
	}
}

// requireDeadCount requires CountDeadLetters to count billing's one dead letter in state.
func requireDeadCount(t *testing.T, db inbox.Querier, state inbox.DeadLetterState) {
	t.Helper()
	counts, err := inbox.CountDeadLetters(context.Background(), db)
	require.NoError(t, err)
	require.Equal(t, []inbox.DeadLetterCount{{Consumer: "billing", State: state, Count: 1}}, counts)
}

// A Kinesis mapping gives no receive count: the consumer counts the record's failures, and the
// StreamMaxAttempts-th marks it dead. The records behind it in its shard are not its fault.
func TestDeadLetterKinesisLastRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "s", Router: router("s"), StreamMaxAttempts: 2, Logger: quiet})
	require.NoError(t, err)
	const shard = "shardId-000000000000"
	recs := []events.KinesisEventRecord{kinesisRec(shard, 1, "a1", script{N: 1, Fail: "error"}), kinesisRec(shard, 2, "a2", script{N: 2})}
	for attempt := 1; attempt <= 2; attempt++ {
		_, err := c.HandleKinesis(context.Background(), events.KinesisEvent{Records: recs})
		require.NoError(t, err)
		dl := deadLetters(t, b.pool, "s", false)
		require.Len(t, dl, 1)
		require.Equal(t, attempt, dl[0].Attempts)
		require.Zero(t, dl[0].ReceiveCount)
		require.Equal(t, "aws:kinesis", dl[0].Source)
		require.Equal(t, testStream, dl[0].SourceName)
		require.Equal(t, shard+"/"+recs[0].Kinesis.SequenceNumber, dl[0].SourcePosition)
		require.Equal(t, map[int]inbox.DeadLetterState{1: inbox.DeadFailing, 2: inbox.DeadDead}[attempt], dl[0].State)
	}
}

// The inbox's retention purges dead letters too, by their last failure.
func TestPurgeRemovesOldDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: router("billing"), Logger: quiet})
	require.NoError(t, err)
	c.Process(ctx, batchOf(received(rec("old", script{Fail: "error"}), 1), received(rec("new", script{Fail: "error"}), 1)))
	_, err = b.pool.Exec(ctx, `UPDATE inbox_dead_letter SET first_failed_at = now() - interval '3 days', last_failed_at = now() - interval '2 days' WHERE record_key = 'old'`)
	require.NoError(t, err)
	n, err := inbox.Purge(ctx, b.pool, 24*time.Hour, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	dl := deadLetters(t, b.pool, "billing", true)
	require.Len(t, dl, 1)
	require.Equal(t, "new", dl[0].Key)
}

// Recording a dead letter is best effort: when it fails, the record's outcome is unchanged and
// its source still holds it.
func TestDeadLetterRecordingFailureChangesNoOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.pool.Exec(ctx, `DROP TABLE inbox_dead_letter`)
	require.NoError(t, err)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: router("billing"), SQSMaxReceiveCount: 1, Logger: quiet})
	require.NoError(t, err)
	rep := c.Process(ctx, batchOf(received(rec("p", script{Fail: "error"}), 1), received(rec("ok", script{N: 1}), 1)))
	require.Equal(t, inbox.Failed, rep.Results[0].Outcome)
	require.False(t, rep.Results[0].Dead, "not recorded, so not reported dead")
	require.Equal(t, inbox.Applied, rep.Results[1].Outcome)
	require.Len(t, rep.Response().BatchItemFailures, 1)
}

// The stored error chain is JSON the operator's tools print as it is.
func TestDeadLetterChainIsJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: router("billing"), Logger: quiet})
	require.NoError(t, err)
	c.Process(ctx, batchOf(received(rec("p", script{Fail: "error"}), 1)))
	var raw string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT error_chain::text FROM inbox_dead_letter`).Scan(&raw))
	var chain []inbox.ErrorLink
	require.NoError(t, json.Unmarshal([]byte(raw), &chain))
	require.GreaterOrEqual(t, len(chain), 2, "the handler's wrapping and the error it wraps")
	require.Contains(t, chain[0].Text, "message p (Scripted): handler: scripted failure")
	require.Equal(t, "scripted failure", chain[len(chain)-1].Text)
}

// A stored row the processor parks is kept as a dead letter too, with its class and chain: each
// failed attempt is recorded, the parking one marks it dead, and its state is the inbox row's.
func TestDeadLetterOfAParkedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	store := newConsumer(t, b.pool, "billing", inbox.Async)
	require.Equal(t, inbox.Stored, store.Process(ctx, batchOf(received(rec("p1", script{N: 1, Fail: "panic"}), 1))).Results[0].Outcome)
	proc, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "billing", Router: router("billing"), MaxAttempts: 2,
		Backoff: func(int) time.Duration { return time.Hour }, Logger: quiet})
	require.NoError(t, err)
	for attempt := 1; attempt <= 2; attempt++ {
		_, err := b.pool.Exec(ctx, `UPDATE inbox_event SET next_attempt_at = NULL`) // its backoff is over
		require.NoError(t, err)
		_, err = proc.Drain(ctx)
		require.NoError(t, err)
		dl := deadLetters(t, b.pool, "billing", false)
		require.Len(t, dl, 1)
		d := dl[0]
		require.Equal(t, attempt, d.Attempts)
		require.Equal(t, "inbox", d.Source)
		require.Equal(t, "inbox_event", d.SourceName)
		require.Equal(t, inbox.ClassHandlerPanic, d.ErrorClass)
		require.JSONEq(t, `{"n":1,"fail":"panic"}`, d.Payload)
		if attempt == 1 {
			require.Equal(t, inbox.DeadRetrying, d.State, "stored, waiting for its next attempt")
			require.Nil(t, d.DeadAt)
		} else {
			require.Equal(t, inbox.DeadParked, d.State)
			require.NotNil(t, d.DeadAt)
		}
	}
}
