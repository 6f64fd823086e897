package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// runMain makes the test binary run main() instead of the tests, so a test can start the
// Lambda's real cold start as a process.
const runMain = "SLUICE_CONSUMER_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMain) == "1" {
		main()
		return
	}
	testdb.Main(m)
}

func sqsEvent(t *testing.T) events.SQSEvent {
	t.Helper()
	return fixture.Load[events.SQSEvent](t, "testdata/sqs_order_created.json")
}

// The skeleton applies a delivery once: its inbox row commits, and a second delivery of the
// same message is a success that changes nothing.
func TestSkeletonAppliesOnceAndDeduplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var logs bytes.Buffer
	c, err := newConsumer(pool, consumerConfig(t, "billing"), slog.New(slog.NewJSONHandler(&logs, nil)))
	require.NoError(t, err)
	ev := sqsEvent(t)
	for range 2 {
		resp, err := c.HandleSQS(ctx, ev)
		require.NoError(t, err)
		require.Empty(t, resp.BatchItemFailures)
	}
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_event WHERE consumer = 'billing'
		AND message_id = '0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b' AND processed_at IS NOT NULL`).Scan(&rows))
	require.Equal(t, 1, rows)
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-42"`)), "the handler ran once")
}

// An event type no handler is registered for fails (FailUnknown) and leaves no inbox row.
func TestSkeletonFailsUnknownEventTypes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := newConsumer(pool, consumerConfig(t, "billing"), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ev := sqsEvent(t)
	rec := ev.Records[0]
	typ := "OrderShipped"
	rec.MessageAttributes = map[string]events.SQSMessageAttribute{"messageId": rec.MessageAttributes["messageId"],
		"eventType": {DataType: "String", StringValue: &typ}}
	ev.Records[0] = rec
	resp, err := c.HandleSQS(ctx, ev)
	require.NoError(t, err)
	require.Equal(t, []events.SQSBatchItemFailure{{ItemIdentifier: rec.MessageId}}, resp.BatchItemFailures)
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_event`).Scan(&rows))
	require.Zero(t, rows)
}

// In the async mode the event source's invocation only stores the message, and the schedule's
// invocation of the same function applies it with the same handlers, once.
func TestAsyncStoresThenTheScheduleApplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	getenv := func(k string) string {
		return map[string]string{lambdaenv.ConsumerName: "billing", lambdaenv.ConsumerCommitMode: "async"}[k]
	}
	cfg, err := lambdaenv.ConsumerConfig(getenv)
	require.NoError(t, err)
	c, err := newConsumer(pool, cfg, log)
	require.NoError(t, err)
	p, err := newProcessor(pool, cfg, getenv, log)
	require.NoError(t, err)
	h := &handler{consumer: c, processor: p, name: "billing", margin: time.Second}

	raw, err := json.Marshal(sqsEvent(t))
	require.NoError(t, err)
	resp, err := h.Handle(ctx, raw)
	require.NoError(t, err)
	require.Empty(t, resp.(events.SQSEventResponse).BatchItemFailures)
	var stored, applied int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(processed_at) FROM inbox_event WHERE consumer = 'billing'`).Scan(&stored, &applied))
	require.Equal(t, 1, stored)
	require.Zero(t, applied, "the source's invocation only stores")
	require.Zero(t, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-42"`)))

	scheduled := []byte(`{"version":"0","id":"e-1","detail-type":"Scheduled Event","source":"aws.events","time":"2026-12-02T07:00:00Z","resources":[],"detail":{}}`)
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second) // the invocation's deadline: it runs until a second before it
	defer cancel()
	out, err := h.Handle(sctx, scheduled)
	require.NoError(t, err)
	require.Equal(t, "billing", out.(ProcessorRun).Consumer)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(processed_at) FROM inbox_event WHERE consumer = 'billing'`).Scan(&stored, &applied))
	require.Equal(t, 1, applied, "the schedule's invocation applied the stored row")
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-42"`)), "the handler ran once")

	// A consumer that is not async has nothing to process: a schedule pointed at it is a mistake.
	sync := &handler{consumer: c, name: "billing", margin: time.Second}
	_, err = sync.Handle(ctx, scheduled)
	require.ErrorContains(t, err, "not in the async commit mode")
}

// consumerConfig is the configuration the Lambda reads with SLUICE_CONSUMER_NAME=name.
func consumerConfig(t *testing.T, name string) inbox.ConsumerConfig {
	t.Helper()
	cfg, err := lambdaenv.ConsumerConfig(func(k string) string { return map[string]string{lambdaenv.ConsumerName: name}[k] })
	require.NoError(t, err)
	return cfg
}
