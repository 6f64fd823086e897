package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// config is what the Lambda reads with SLUICE_CONSUMER_NAME=name.
func config(t *testing.T, name string) inbox.ConsumerConfig {
	t.Helper()
	cfg, err := lambdaenv.ConsumerConfig(func(k string) string { return map[string]string{lambdaenv.ConsumerName: name}[k] })
	require.NoError(t, err)
	return cfg
}

func sqsEvent(t *testing.T) events.SQSEvent {
	t.Helper()
	return fixture.Load[events.SQSEvent](t, "testdata/sqs_order_created.json")
}

// A delivery is applied once: the ledger entry and the projection commit with the inbox row,
// and a second delivery of the same message changes nothing.
func TestHandleSQSAppliesOnceAndDeduplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := newConsumer(ctx, pool, config(t, "ledger-test"), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ev := sqsEvent(t)

	for range 2 {
		resp, err := c.HandleSQS(ctx, ev)
		require.NoError(t, err)
		require.Empty(t, resp.BatchItemFailures)
	}
	var entries, orders int
	var total int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM demo_ledger WHERE message_id = '0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b'`).Scan(&entries))
	require.NoError(t, pool.QueryRow(ctx, `SELECT orders, total_cents FROM demo_customer_balance WHERE customer = 'c01'`).Scan(&orders, &total))
	require.Equal(t, 1, entries)
	require.Equal(t, 1, orders)
	require.EqualValues(t, 4200, total)
	var inboxRows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_event WHERE consumer = 'ledger-test'`).Scan(&inboxRows))
	require.Equal(t, 1, inboxRows)
}

// A poison record (unknown currency) is reported in BatchItemFailures and leaves no trace;
// the other record of the batch is applied.
func TestHandleSQSReportsOnlyTheFailedRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := newConsumer(ctx, pool, config(t, "ledger-test"), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ev := sqsEvent(t)
	bad := ev.Records[0]
	bad.MessageId = "poison-sqs-id"
	bad.Body = `{"order_id":"fixture-0002","customer":"c02","seq":1,"amount_cents":1,"currency":"XTS"}`
	attrs := map[string]events.SQSMessageAttribute{}
	for k, v := range bad.MessageAttributes {
		attrs[k] = v
	}
	id := "0193a5b2-7c4d-7e8f-9a0b-000000000002"
	attrs["messageId"] = events.SQSMessageAttribute{DataType: "String", StringValue: &id}
	bad.MessageAttributes = attrs
	ev.Records = append(ev.Records, bad)

	resp, err := c.HandleSQS(ctx, ev)
	require.NoError(t, err)
	require.Equal(t, []events.SQSBatchItemFailure{{ItemIdentifier: "poison-sqs-id"}}, resp.BatchItemFailures)
	var inboxRows, entries int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_event WHERE message_id = $1`, id).Scan(&inboxRows))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM demo_ledger`).Scan(&entries))
	require.Zero(t, inboxRows, "the failed record's inbox row was rolled back")
	require.Equal(t, 1, entries)
	out, err := json.Marshal(resp)
	require.NoError(t, err)
	require.JSONEq(t, `{"batchItemFailures":[{"itemIdentifier":"poison-sqs-id"}]}`, string(out))
}

// The demo payload's fault hooks: fail_attempts fails the first deliveries (by SQS receive
// count) and then applies; nothing is written while it fails.
func TestFailAttemptsFailsTheFirstDeliveriesOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := newConsumer(ctx, pool, config(t, "ledger-test"), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ev := sqsEvent(t)
	ev.Records[0].Body = `{"order_id":"fixture-0001","customer":"c01","seq":1,"amount_cents":4200,"currency":"EUR","fail_attempts":2}`
	for i, wantFailed := range []bool{true, true, false, false} { // the 4th receive is a duplicate
		rec := ev.Records[0]
		receive := strconv.Itoa(i + 1)
		rec.Attributes = map[string]string{"ApproximateReceiveCount": receive}
		resp, err := c.HandleSQS(ctx, events.SQSEvent{Records: []events.SQSMessage{rec}})
		require.NoError(t, err)
		require.Equal(t, wantFailed, len(resp.BatchItemFailures) == 1, "receive %s", receive)
	}
	var entries int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM demo_ledger`).Scan(&entries))
	require.Equal(t, 1, entries)
}
