package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"testing"

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

// The real cold start refuses the async commit mode before it connects anywhere: no processor
// runs beside this Lambda, so messages would be acknowledged and never applied.
func TestColdStartRefusesAsync(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), runMain+"=1", lambdaenv.ConsumerName+"=billing", lambdaenv.ConsumerCommitMode+"=async",
		lambdaenv.DatabaseURL+"=postgres://nobody@127.0.0.1:1/none")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output: %s", out)
	require.Equal(t, 1, exit.ExitCode())
	require.Contains(t, string(out), "consumer cold start failed")
	require.Contains(t, string(out), "commit mode async needs an inbox Processor")
}

// consumerConfig is the configuration the Lambda reads with SLUICE_CONSUMER_NAME=name.
func consumerConfig(t *testing.T, name string) inbox.ConsumerConfig {
	t.Helper()
	cfg, err := lambdaenv.ConsumerConfig(func(k string) string { return map[string]string{lambdaenv.ConsumerName: name}[k] })
	require.NoError(t, err)
	return cfg
}
