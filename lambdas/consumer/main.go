// Command consumer is the consumer Lambda to copy: an event source mapping (with
// ReportBatchItemFailures) delivers the outbox's events - from SQS, a Kinesis stream or a Kafka
// topic (Amazon MSK or self-managed) - and pkg/inbox applies each one exactly once: the inbox
// row and the handler's writes commit in one transaction, and a record is reported successful
// only after that commit. consumer.HandleEvent recognises which source invoked it, so this one
// binary serves any of those mappings; a function tied to one source can start
// consumer.HandleSQS, consumer.HandleKinesis or consumer.HandleKafka instead (docs/inbox.md,
// "Event sources", says what to enable on each mapping). This file is the whole program: configuration,
// the router with its handlers, the inbox consumer. The example stack (infra/) deploys it as it
// is; a team copies the directory, registers its own handlers in [handlers] and points the
// construct's ConsumerProps.CodeDir at its build (docs/deploy.md, "Your consumer").
//
// Configuration (read once per cold start by lambdaenv.ConsumerConfig and lambdaenv.OpenPool):
// SLUICE_CONSUMER_NAME (required), SLUICE_CONSUMER_COMMIT_MODE (per-record or batched; async
// is refused at cold start, since no inbox Processor runs beside this Lambda),
// SLUICE_CONSUMER_DEADLINE_MARGIN, SLUICE_CONSUMER_STORE_PAYLOAD; SLUICE_CLAIM_CHECK_BUCKET and
// SLUICE_CLAIM_CHECK_MAX_PAYLOAD (fetch payloads a claim check stored in S3,
// lambdaenv.ConsumerClaimCheck); DATABASE_URL, or
// DATABASE_SECRET_ARN naming the RDS Secrets Manager secret; DATABASE_MAX_CONNS. AWS clients
// honour AWS_ENDPOINT_URL. OTEL_TRACES_EXPORTER=console records a consumer span per record, a
// child of the span that wrote the event, as JSON lines in the log (pkg/lambdatrace; see
// docs/tracing.md to export to X-Ray or any OTLP backend instead).
//
// Build: GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -o bin/consumer/bootstrap ./lambdas/consumer
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/lambdatrace"
)

// handlers is where a team registers its handlers: one Handle call per event type this consumer
// applies. Each runs inside the transaction that also inserts the message's inbox row: write
// through tx, never commit it, and return an error to roll everything back (the record then
// comes back from SQS, and reaches the DLQ after maxReceiveCount; on Kinesis and Kafka it blocks
// its shard or partition until it succeeds or the mapping's retry limit sends it to the
// on-failure destination). FailUnknown keeps an event type nobody handles from vanishing: it
// fails like an error.
func handlers(log *slog.Logger) *inbox.Router {
	r := inbox.NewRouter(inbox.FailUnknown)
	// Replace this example with your own handlers.
	r.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var order struct {
			OrderID string `json:"orderId"`
		}
		if err := msg.Decode(&order); err != nil {
			return err
		}
		// Your effects go here, through tx, e.g.
		// tx.Exec(ctx, `INSERT INTO invoice (order_id) VALUES ($1)`, order.OrderID)
		log.InfoContext(ctx, "order created", "messageId", msg.ID, "orderId", order.OrderID)
		return nil
	})
	return r
}

func main() {
	ctx := context.Background()
	log := lambdaenv.Logger(os.Getenv, "consumer")
	cfg, err := lambdaenv.ConsumerConfig(os.Getenv) // before the pool: a bad setting costs no connection
	if err != nil {
		log.Error("consumer cold start failed", "error", err)
		os.Exit(1)
	}
	// Payloads a claim check stored in S3 are fetched before the handlers run (SLUICE_CLAIM_CHECK_BUCKET).
	if cfg.ClaimCheck, err = lambdaenv.ConsumerClaimCheck(ctx, os.Getenv); err != nil {
		log.Error("consumer cold start failed", "error", err)
		os.Exit(1)
	}
	// Tracing is off unless OTEL_TRACES_EXPORTER asks for it (a nil provider costs nothing).
	tp, stopTracing, err := lambdatrace.Setup(os.Getenv, os.Stdout, "sluice-consumer")
	if err != nil {
		log.Error("consumer cold start failed", "error", err)
		os.Exit(1)
	}
	cfg.TracerProvider = tp
	pool, err := lambdaenv.OpenPool(ctx, os.Getenv)
	if err != nil {
		log.Error("consumer cold start failed", "error", err)
		os.Exit(1)
	}
	c, err := newConsumer(pool, cfg, log)
	if err != nil {
		log.Error("consumer cold start failed", "error", err)
		os.Exit(1)
	}
	lambda.StartWithOptions(c.HandleEvent, lambda.WithEnableSIGTERM(pool.Close, func() { _ = stopTracing(context.Background()) }))
}

// newConsumer builds the inbox consumer over db with cfg's settings and this file's handlers.
func newConsumer(db inbox.Beginner, cfg inbox.ConsumerConfig, log *slog.Logger) (*inbox.Consumer, error) {
	cfg.Router = handlers(log)
	cfg.Metrics = os.Stdout // EMF lines: CloudWatch turns them into metrics
	cfg.Logger = log
	c, err := inbox.NewConsumer(db, cfg)
	if err != nil {
		return nil, fmt.Errorf("create inbox consumer: %w", err)
	}
	return c, nil
}
