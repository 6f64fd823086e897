package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/examples/internal/exampletest"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// store has an async consumer store n OrderCreated messages (from first on) as the consumer
// Lambda in async mode does.
func store(t *testing.T, pool *pgxpool.Pool, first, n int) {
	t.Helper()
	c, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{Consumer: "billing", Mode: inbox.Async, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	var ev events.SQSEvent
	for i := first; i < first+n; i++ {
		id := fmt.Sprintf("m-%04d", i)
		ev.Records = append(ev.Records, events.SQSMessage{MessageId: id, EventSource: "aws:sqs",
			Body: fmt.Sprintf(`{"orderId": "o-%04d"}`, i),
			MessageAttributes: map[string]events.SQSMessageAttribute{
				"messageId": {DataType: "String", StringValue: &id},
				"eventType": {DataType: "String", StringValue: ptr("OrderCreated")},
			}})
		if len(ev.Records) == 10 || i == first+n-1 {
			rep := c.Process(context.Background(), ev)
			require.Equal(t, len(ev.Records), rep.Count(inbox.Stored))
			ev.Records = nil
		}
	}
}

func ptr(s string) *string { return &s }

func invoices(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM example_invoice`).Scan(&n); err != nil {
		return -1 // the process has not created its table yet
	}
	return n
}

// TestProcessorProcessAppliesStoredRowsAndStopsCleanlyOnSIGTERM runs the built example: it
// applies what the async consumer stored, answers its probes, exits 0 on SIGTERM, and a
// restarted process applies what arrived meanwhile, each message exactly once.
func TestProcessorProcessAppliesStoredRowsAndStopsCleanlyOnSIGTERM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := exampletest.Build(t)
	dbURL := testdb.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store(t, pool, 0, 200)

	env := append(os.Environ(), "DATABASE_URL="+dbURL, lambdaenv.ConsumerName+"=billing", "SLUICE_HEALTH_ADDR=127.0.0.1:0")
	first, health := exampletest.Start(t, bin, env, "processor started")
	require.Equal(t, http.StatusOK, exampletest.Status(health, "/healthz"))
	require.Equal(t, http.StatusOK, exampletest.Status(health, "/readyz"))
	testwait.Until(t, "the stored rows applied", func() bool { return invoices(t, pool) == 200 })
	require.NoError(t, first.Process.Signal(syscall.SIGTERM))
	require.NoError(t, first.Wait(), "SIGTERM ends the processor with exit code 0")

	// Stored while no processor ran: the next one applies them.
	store(t, pool, 200, 50)
	second, _ := exampletest.Start(t, bin, env, "processor started")
	testwait.Until(t, "the later rows applied", func() bool { return invoices(t, pool) == 250 })
	require.NoError(t, second.Process.Signal(syscall.SIGTERM))
	require.NoError(t, second.Wait())

	var unprocessed, distinct int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_event WHERE consumer = 'billing' AND processed_at IS NULL`).Scan(&unprocessed))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM example_invoice`).Scan(&distinct))
	require.Zero(t, unprocessed)
	require.Equal(t, 250, distinct, "each message applied once")
}

// TestProcessorRefusesAMissingConsumerName: a bad configuration stops it before it connects.
func TestProcessorRefusesAMissingConsumerName(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), func(string) string { return "" }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorContains(t, err, lambdaenv.ConsumerName+" is required")
}
