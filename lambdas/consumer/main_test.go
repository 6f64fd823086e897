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
	h := &handler{consumer: c, processor: p, async: true, name: "billing", margin: time.Second}

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

	sctx, cancel := context.WithTimeout(ctx, 3*time.Second) // the invocation's deadline: it runs until a second before it
	defer cancel()
	out, err := h.Handle(sctx, scheduled)
	require.NoError(t, err)
	require.Equal(t, "billing", out.(ProcessorRun).Consumer)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(processed_at) FROM inbox_event WHERE consumer = 'billing'`).Scan(&stored, &applied))
	require.Equal(t, 1, applied, "the schedule's invocation applied the stored row")
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-42"`)), "the handler ran once")
}

// scheduled is the event the processor schedule's EventBridge rule invokes the function with.
var scheduled = []byte(`{"version":"0","id":"e-1","detail-type":"Scheduled Event","source":"aws.events","time":"2026-12-02T07:00:00Z","resources":[],"detail":{}}`)

// A per-record consumer's schedule applies the rows stored for it, as `sluice dead retry`
// stores a dead letter (the async mode's row: processed_at NULL, payload and headers kept),
// with the same handlers, once; the event source's deliveries of that message then change
// nothing.
func TestPerRecordScheduleAppliesStoredRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	getenv := func(k string) string { return map[string]string{lambdaenv.ConsumerName: "billing"}[k] }
	cfg, err := lambdaenv.ConsumerConfig(getenv)
	require.NoError(t, err)
	require.Equal(t, inbox.PerRecord, cfg.Mode)
	c, err := newConsumer(pool, cfg, log)
	require.NoError(t, err)
	p, err := newProcessor(pool, cfg, getenv, log)
	require.NoError(t, err)
	h := &handler{consumer: c, processor: p, name: "billing", margin: time.Second}

	const id = "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b" // the fixture's message
	_, err = pool.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, aggregate_type, aggregate_id,
		created_at, headers, payload) VALUES ('billing', $1, 'OrderCreated', 'order', 'o-42', now(), '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', '{"orderId":"o-42","totalCents":4200}')`, id)
	require.NoError(t, err)

	ran := 0
	for range 2 { // the second finds nothing to do
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		out, err := h.Handle(sctx, scheduled)
		cancel()
		require.NoError(t, err)
		require.Equal(t, "billing", out.(ProcessorRun).Consumer)
		ran += out.(ProcessorRun).Applied
	}
	require.Equal(t, 1, ran)
	var applied int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_event WHERE consumer = 'billing' AND message_id = $1
		AND processed_at IS NOT NULL`, id).Scan(&applied))
	require.Equal(t, 1, applied, "the schedule's invocation applied the stored row")
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-42"`)), "the handler ran once")

	// The source delivers the same message again: a duplicate, the handler does not run.
	raw, err := json.Marshal(sqsEvent(t))
	require.NoError(t, err)
	resp, err := h.Handle(ctx, raw)
	require.NoError(t, err)
	require.Empty(t, resp.(events.SQSEventResponse).BatchItemFailures)
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-42"`)), "the handler ran once")
}

// consumerConfig is the configuration the Lambda reads with SLUICE_CONSUMER_NAME=name.
func consumerConfig(t *testing.T, name string) inbox.ConsumerConfig {
	t.Helper()
	cfg, err := lambdaenv.ConsumerConfig(func(k string) string { return map[string]string{lambdaenv.ConsumerName: name}[k] })
	require.NoError(t, err)
	return cfg
}
