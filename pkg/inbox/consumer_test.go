package inbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/metrics"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Router: router("c")})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	_, err = inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c"})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig, "router required in the synchronous modes")
	_, err = inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Mode: inbox.Async, Logger: quiet})
	require.NoError(t, err, "the async consumer only stores")
	_, err = inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: router("c"), Mode: inbox.Mode(9)})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	_, err = inbox.NewConsumer(nil, inbox.ConsumerConfig{Consumer: "c", Router: router("c")})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)

	require.Equal(t, inbox.DefaultDeadlineMargin, inbox.ConsumerConfig{}.WithDefaults().DeadlineMargin)
	for s, want := range map[string]inbox.Mode{"": inbox.PerRecord, "per-record": inbox.PerRecord, "batched": inbox.Batched, "ASYNC": inbox.Async} {
		m, err := inbox.ParseMode(s)
		require.NoError(t, err)
		require.Equal(t, want, m)
	}
	_, err = inbox.ParseMode("sometimes")
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)

	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("B", scripted("c"))
	r.Handle("A", scripted("c"))
	require.Equal(t, []string{"A", "B"}, r.EventTypes())
	require.Panics(t, func() { r.Handle("A", scripted("c")) })
	require.Panics(t, func() { r.Handle("", scripted("c")) })
	require.Panics(t, func() { r.Handle("C", nil) })
}

func TestDuplicateDeliveryAppliesOnce(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c := newConsumer(t, b.pool, "billing", mode)
		ctx := context.Background()

		// m1 twice in the same batch (standard queues may do that), then the whole batch again.
		ev := batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2}), rec("m1", script{N: 1}))
		ev.Records[2].MessageId = "sqs-m1-again"
		rep := c.Process(ctx, ev)
		require.Equal(t, []string{"sqs-m1:applied", "sqs-m2:applied", "sqs-m1-again:duplicate"}, outcomes(rep))
		rep = c.Process(ctx, ev)
		require.Equal(t, []string{"sqs-m1:duplicate", "sqs-m2:duplicate", "sqs-m1-again:duplicate"}, outcomes(rep))
		require.Empty(t, rep.Response().BatchItemFailures)

		require.Equal(t, state{
			Inbox:   []string{"billing/m1/true", "billing/m2/true"},
			Effects: []string{"billing/m1/1", "billing/m2/2"},
		}, dbState(t, b.pool))
	})
}

func TestConcurrentConsumersApplyOnce(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		// A slow handler keeps the first transaction open while the other delivery arrives: the
		// second INSERT waits on the first's key and then finds the row.
		r := inbox.NewRouter(inbox.FailUnknown)
		var calls sync.Map
		r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
			calls.Store(msg.SQSMessageID, true)
			time.Sleep(50 * time.Millisecond)
			return scripted("billing")(ctx, tx, msg)
		})
		const instances = 4
		var wg sync.WaitGroup
		reps := make([]inbox.Report, instances)
		for i := range instances {
			c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: r, Mode: mode, Logger: quiet})
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				reps[i] = c.Process(context.Background(), batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2})))
			}()
		}
		wg.Wait()
		applied, dup := 0, 0
		for _, rep := range reps {
			for _, res := range rep.Results {
				switch res.Outcome {
				case inbox.Applied:
					applied++
				case inbox.Duplicate:
					dup++
				default:
					// A deadlock between two batched transactions is allowed: the record fails and comes back.
					require.Equal(t, inbox.Batched, mode, "unexpected %v: %v", res.Outcome, res.Err)
				}
			}
		}
		require.Equal(t, 2, applied, "each message applied exactly once")
		st := dbState(t, b.pool)
		require.Equal(t, []string{"billing/m1/1", "billing/m2/2"}, st.Effects)
	})
}

func TestFanOutTwoConsumersBothApply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	billing := newConsumer(t, b.pool, "billing", inbox.PerRecord)
	shipping := newConsumer(t, b.pool, "shipping", inbox.Batched)
	ev := batchOf(rec("m1", script{N: 1}))
	require.Equal(t, 1, billing.Process(ctx, ev).Count(inbox.Applied))
	require.Equal(t, 1, shipping.Process(ctx, ev).Count(inbox.Applied))
	require.Equal(t, 1, billing.Process(ctx, ev).Count(inbox.Duplicate))
	require.Equal(t, 1, shipping.Process(ctx, ev).Count(inbox.Duplicate))
	require.Equal(t, state{
		Inbox:   []string{"billing/m1/true", "shipping/m1/true"},
		Effects: []string{"billing/m1/1", "shipping/m1/1"},
	}, dbState(t, b.pool))
}

func TestHandlerErrorAndPanicRollBackAlone(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c := newConsumer(t, b.pool, "billing", mode)
		ctx := context.Background()
		ev := batchOf(
			rec("m1", script{N: 1}),
			rec("m2", script{N: 2, Fail: "error"}),
			rec("m3", script{N: 3}),
			rec("m4", script{N: 4, Fail: "panic"}),
			rec("m5", script{N: 5}),
		)
		resp, err := c.HandleSQS(ctx, ev)
		require.NoError(t, err)
		require.Equal(t, []string{"sqs-m2", "sqs-m4"}, failedIDs(resp))

		rep := c.Process(ctx, ev) // redelivery of the whole batch: the successes are duplicates now
		require.Equal(t, []string{"sqs-m1:duplicate", "sqs-m2:failed", "sqs-m3:duplicate", "sqs-m4:failed", "sqs-m5:duplicate"}, outcomes(rep))
		require.ErrorContains(t, rep.Results[1].Err, "scripted failure")
		require.ErrorIs(t, rep.Results[3].Err, inbox.ErrHandlerPanic)
		var pe *inbox.PanicError
		require.ErrorAs(t, rep.Results[3].Err, &pe)
		require.Equal(t, "scripted panic", pe.Value)
		require.NotEmpty(t, pe.Stack)

		require.Equal(t, state{
			Inbox:   []string{"billing/m1/true", "billing/m3/true", "billing/m5/true"},
			Effects: []string{"billing/m1/1", "billing/m3/3", "billing/m5/5"},
		}, dbState(t, b.pool), "neither the inbox row nor the effect of a failed record survives")
	})
}

func TestFIFOGroupFailsAfterFailure(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c := newConsumer(t, b.pool, "billing", mode)
		ev := batchOf(
			fifo(rec("a1", script{N: 1}), "A"),
			fifo(rec("b1", script{N: 1}), "B"),
			fifo(rec("a2", script{N: 2, Fail: "error"}), "A"),
			fifo(rec("b2", script{N: 2}), "B"),
			fifo(rec("a3", script{N: 3}), "A"), // would succeed, but must wait for a2
			fifo(rec("a4", script{N: 4}), "A"),
		)
		rep := c.Process(context.Background(), ev)
		require.Equal(t, []string{"sqs-a1:applied", "sqs-b1:applied", "sqs-a2:failed", "sqs-b2:applied", "sqs-a3:failed", "sqs-a4:failed"}, outcomes(rep))
		require.ErrorIs(t, rep.Results[4].Err, inbox.ErrGroupBlocked)
		require.ErrorIs(t, rep.Results[5].Err, inbox.ErrGroupBlocked)
		require.Equal(t, []string{"billing/a1/1", "billing/b1/1", "billing/b2/2"}, dbState(t, b.pool).Effects)
	})
}

func TestFIFOFixtureAndBadRecordBlocksItsGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("OrderStep", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ('c', $1, 0)`, msg.ID)
		return err
	})
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: r, Logger: quiet})
	require.NoError(t, err)
	ev := loadEvent(t, "sqs_fifo.json")
	ev.Records[0].Body = "{not json" // the head of group order-1 is unparseable
	rep := c.Process(context.Background(), ev)
	require.Equal(t, inbox.Failed, rep.Results[0].Outcome)
	require.ErrorIs(t, rep.Results[0].Err, inbox.ErrBadMessage)
	require.ErrorIs(t, rep.Results[1].Err, inbox.ErrGroupBlocked)
	require.Equal(t, inbox.Applied, rep.Results[2].Outcome)
	require.Equal(t, []string{"c/0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f5003/0"}, dbState(t, b.pool).Effects)
}

func TestDeadline(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		// The consumer's clock is the test's: the first record's handler takes "ten minutes",
		// after which less than the margin is left, whatever the machine's speed.
		deadline := time.Now().Add(time.Hour)
		var mu sync.Mutex
		clock := deadline.Add(-30 * time.Minute)
		now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
		r := inbox.NewRouter(inbox.FailUnknown)
		r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
			mu.Lock()
			clock = clock.Add(25 * time.Minute)
			mu.Unlock()
			return scripted("billing")(ctx, tx, msg)
		})
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: r, Mode: mode, DeadlineMargin: 10 * time.Minute, Logger: quiet})
		require.NoError(t, err)
		inbox.SetClock(c, now)

		// 30 minutes left with a 10-minute margin: the first record starts, and after its 25
		// minutes the rest find too little time.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		ev := batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2}), rec("m3", script{N: 3}))
		rep := c.Process(ctx, ev)
		require.Equal(t, []string{"sqs-m1:applied", "sqs-m2:failed", "sqs-m3:failed"}, outcomes(rep))
		require.ErrorIs(t, rep.Results[1].Err, inbox.ErrDeadline)
		require.Equal(t, []string{"billing/m1/1"}, dbState(t, b.pool).Effects)

		// Less time than the margin from the start: nothing starts, nothing is written.
		rep = c.Process(ctx, batchOf(rec("m4", script{N: 4})))
		require.ErrorIs(t, rep.Results[0].Err, inbox.ErrDeadline)
		require.Equal(t, 1, count(t, b.pool, `SELECT count(*) FROM inbox_event`))

		// An already cancelled context starts nothing either, even with the margin disabled.
		c2, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: r, Mode: mode, DeadlineMargin: -1, Logger: quiet})
		require.NoError(t, err)
		done, cancel3 := context.WithCancel(context.Background())
		cancel3()
		rep = c2.Process(done, batchOf(rec("m5", script{N: 5})))
		require.ErrorIs(t, rep.Results[0].Err, inbox.ErrDeadline)
		require.Equal(t, 1, count(t, b.pool, `SELECT count(*) FROM inbox_event`))
	})
}

// TestModesGiveIdenticalResults runs the same scripted batches, in sequence, through a
// per-record consumer and a batched one on separate databases and compares every outcome and
// the final database state.
func TestModesGiveIdenticalResults(t *testing.T) {
	t.Parallel()
	bad := record("sqs-bad", `not json`, map[string]string{"messageId": "bad", "eventType": "Scripted"})
	unknown := record("sqs-unk", `{}`, map[string]string{"messageId": "unk", "eventType": "Nobody"})
	for _, tc := range []struct {
		name    string
		batches []events.SQSEvent
	}{
		{"all succeed", []events.SQSEvent{batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2}))}},
		{"error and panic in the middle", []events.SQSEvent{batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2, Fail: "error"}), rec("m3", script{N: 3, Fail: "panic"}), rec("m4", script{N: 4}))}},
		{"redelivery after partial failure", []events.SQSEvent{
			batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2, Fail: "error"})),
			batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2})),
		}},
		{"duplicates within a batch", []events.SQSEvent{batchOf(rec("m1", script{N: 1}), rec("m1", script{N: 1}), rec("m2", script{N: 2, Fail: "error"}), rec("m2", script{N: 2}))}},
		{"bad and unknown records", []events.SQSEvent{batchOf(bad, rec("m1", script{N: 1}), unknown, rec("m2", script{N: 2}))}},
		{"fifo groups", []events.SQSEvent{batchOf(
			fifo(rec("a1", script{N: 1}), "A"), fifo(rec("a2", script{N: 2, Fail: "panic"}), "A"),
			fifo(rec("b1", script{N: 1}), "B"), fifo(rec("a3", script{N: 3}), "A"), fifo(rec("b2", script{N: 2}), "B"),
		)}},
		{"everything fails", []events.SQSEvent{batchOf(rec("m1", script{N: 1, Fail: "error"}), rec("m2", script{N: 2, Fail: "panic"}))}},
		{"a handler swallows a failed statement", []events.SQSEvent{batchOf(rec("m1", script{N: 1}), rec("m2", script{N: 2, Fail: "swallow"}), rec("m3", script{N: 3}))}},
		{"empty batch", []events.SQSEvent{{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			type run struct {
				outcomes [][]string
				errs     [][]string
				state    state
			}
			do := func(mode inbox.Mode) run {
				b := setup(t)
				c := newConsumer(t, b.pool, "c", mode)
				var r run
				for _, ev := range tc.batches {
					rep := c.Process(context.Background(), ev)
					r.outcomes = append(r.outcomes, outcomes(rep))
					var es []string
					for _, res := range rep.Results {
						if res.Err != nil {
							es = append(es, res.Err.Error())
						}
					}
					r.errs = append(r.errs, es)
				}
				r.state = dbState(t, b.pool)
				return r
			}
			per, batched := do(inbox.PerRecord), do(inbox.Batched)
			require.Equal(t, per.outcomes, batched.outcomes)
			require.Equal(t, per.errs, batched.errs, "same per-record errors")
			require.Equal(t, per.state, batched.state)
		})
	}
}

func TestBadInputNothingHalfApplied(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c := newConsumer(t, b.pool, "c", mode)
		brokenEnvelope := record("sqs-env", `{"Type":"Notification","TopicArn":"arn:aws:sns:x:1:t","MessageId":"n1","Message":"{\"orderId\":"}`, nil)
		mistyped := record("sqs-typ", `{}`, map[string]string{"messageId": "typ", "eventType": "Scripted"})
		mistyped.MessageAttributes["createdAt"] = events.SQSMessageAttribute{DataType: "Binary", BinaryValue: []byte{1}}
		ev := batchOf(
			record("sqs-txt", "hello", map[string]string{"messageId": "txt", "eventType": "Scripted"}),
			rec("ok1", script{N: 1}),
			record("sqs-noattr", `{"n":1}`, nil),
			brokenEnvelope,
			mistyped,
			rec("ok2", script{N: 2}),
		)
		rep := c.Process(context.Background(), ev)
		require.Equal(t, []string{"sqs-txt:failed", "sqs-ok1:applied", "sqs-noattr:failed", "sqs-env:failed", "sqs-typ:failed", "sqs-ok2:applied"}, outcomes(rep))
		for _, i := range []int{0, 2, 3, 4} {
			require.ErrorIs(t, rep.Results[i].Err, inbox.ErrBadMessage, "record %d", i)
			require.Contains(t, rep.Results[i].Err.Error(), rep.Results[i].SQSMessageID, "the error names the record")
		}
		require.Equal(t, state{
			Inbox:   []string{"c/ok1/true", "c/ok2/true"},
			Effects: []string{"c/ok1/1", "c/ok2/2"},
		}, dbState(t, b.pool))
	})
}

func TestEmptyBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b.pool, "c", inbox.PerRecord)
	resp, err := c.HandleSQS(context.Background(), events.SQSEvent{})
	require.NoError(t, err)
	require.NotNil(t, resp.BatchItemFailures)
	require.Empty(t, resp.BatchItemFailures)
	b2, _ := json.Marshal(resp)
	require.JSONEq(t, `{"batchItemFailures":[]}`, string(b2))
}

func TestHugeBatch(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c := newConsumer(t, b.pool, "c", mode)
		const n = 1500
		recs := make([]events.SQSMessage, 0, n)
		for i, id := range ids(n, "m") {
			s := script{N: i}
			if i%100 == 7 {
				s.Fail = "error"
			}
			recs = append(recs, rec(id, s))
		}
		rep := c.Process(context.Background(), batchOf(recs...))
		require.Equal(t, n-15, rep.Count(inbox.Applied))
		require.Len(t, rep.Response().BatchItemFailures, 15)
		require.Equal(t, n-15, count(t, b.pool, `SELECT count(*) FROM effect`))
		require.Equal(t, n-15, count(t, b.pool, `SELECT count(*) FROM inbox_event`))
	})
}

func TestUnknownEventTypes(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		ctx := context.Background()
		unknown := record("sqs-u", `{}`, map[string]string{"messageId": "u1", "eventType": "Nobody"})

		failing := newConsumer(t, b.pool, "strict", mode)
		rep := failing.Process(ctx, batchOf(unknown))
		require.ErrorIs(t, rep.Results[0].Err, inbox.ErrUnknownEventType)
		require.Contains(t, rep.Results[0].Err.Error(), `"Nobody"`)

		r := inbox.NewRouter(inbox.SkipUnknown)
		skipping, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "lenient", Router: r, Mode: mode, Logger: quiet})
		require.NoError(t, err)
		require.Equal(t, inbox.Skipped, skipping.Process(ctx, batchOf(unknown)).Results[0].Outcome)
		require.Equal(t, inbox.Duplicate, skipping.Process(ctx, batchOf(unknown)).Results[0].Outcome)
		require.Equal(t, []string{"lenient/u1/true"}, dbState(t, b.pool).Inbox)
	})
}

func TestEnvelopeFixtureAppliesAndRecordsRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := inbox.NewRouter(inbox.FailUnknown)
	var seen []inbox.Message
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		seen = append(seen, msg)
		return nil
	}
	r.Handle("OrderCreated", h)
	r.Handle("OrderShipped", h)
	var logs bytes.Buffer
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "shipping", Router: r, StorePayload: true,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	rep := c.Process(ctx, loadEvent(t, "sqs_sns_envelope.json"))
	require.Equal(t, 2, rep.Count(inbox.Applied))
	require.Len(t, seen, 2)
	require.Contains(t, logs.String(), `"source":"sns"`, "the fallback to the SNS MessageId is logged")

	var (
		eventType, aggID string
		created          *time.Time
		headers          map[string]string
		payload          string
		received, proc   time.Time
	)
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT event_type, aggregate_id, created_at, headers, payload::text, received_at, processed_at
		FROM inbox_event WHERE consumer = 'shipping' AND message_id = '0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f4b01'`).
		Scan(&eventType, &aggID, &created, &headers, &payload, &received, &proc))
	require.Equal(t, "OrderCreated", eventType)
	require.Equal(t, "ord-2002", aggID)
	require.Equal(t, time.Date(2026, 11, 29, 10, 41, 2, 1000000, time.UTC), created.UTC())
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", headers["traceparent"])
	require.JSONEq(t, string(seen[0].Payload), payload)
	require.False(t, proc.Before(received))

	// Without StorePayload the row carries no payload.
	c2 := newConsumer(t, b.pool, "billing", inbox.PerRecord)
	require.Equal(t, 1, c2.Process(ctx, batchOf(rec("m1", script{N: 1}))).Count(inbox.Applied))
	require.Equal(t, 1, count(t, b.pool, `SELECT count(*) FROM inbox_event WHERE consumer = 'billing' AND payload IS NULL`))
}

func TestUnstorablePayloadIsABadMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Mode: inbox.Async, Logger: quiet})
	require.NoError(t, err)
	rep := c.Process(context.Background(), batchOf(
		record("sqs-bad", "{\"s\":\"\xff\"}", map[string]string{"messageId": "bad", "eventType": "X"}), // not UTF-8
		record("sqs-ok", `{"s":"\u0000 is stored by json"}`, map[string]string{"messageId": "ok", "eventType": "X"}),
	))
	require.Equal(t, []string{"sqs-bad:failed", "sqs-ok:stored"}, outcomes(rep))
	require.ErrorIs(t, rep.Results[0].Err, inbox.ErrBadMessage)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var out bytes.Buffer
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: router("billing"), Metrics: &out, Logger: quiet})
	require.NoError(t, err)
	c.Process(context.Background(), batchOf(rec("m1", script{N: 1}), rec("m1", script{N: 1}), rec("m2", script{N: 2, Fail: "error"})))

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 1)
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &line))
	require.Equal(t, "consumer", line["Service"])
	require.Equal(t, "billing", line["Consumer"])
	require.EqualValues(t, 1, line[metrics.InboxProcessed.Name])
	require.EqualValues(t, 1, line[metrics.InboxDuplicates.Name])
	require.EqualValues(t, 1, line[metrics.InboxFailures.Name])
	lat, ok := line[metrics.CommitToApplyLatency.Name].([]any)
	require.True(t, ok, "latency samples: %v", line)
	require.Len(t, lat, 1)
	// createdAt is 2026-11-29T10:00:00Z in the scripted records.
	want := time.Since(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)).Milliseconds()
	require.InDelta(t, float64(want), lat[0].(float64), 60_000)
	require.Contains(t, lines[0], `"_aws"`)
}

func TestHandlerSeesMessageFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := inbox.NewRouter(inbox.FailUnknown)
	var got inbox.Message
	r.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error { got = msg; return nil })
	r.Handle("OrderCancelled", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error { return fmt.Errorf("not today") })
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: r, Logger: quiet})
	require.NoError(t, err)
	resp, err := c.HandleSQS(context.Background(), loadEvent(t, "sqs_raw.json"))
	require.NoError(t, err)
	require.Equal(t, []string{"2e1424d4-f796-459a-8184-9c92662be6da"}, failedIDs(resp))
	require.Equal(t, "0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f4a5b", got.ID)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", got.Traceparent())
}
