// Command consumer is sluice's reference consumer Lambda, the one to copy: an SQS event source
// (with ReportBatchItemFailures) delivers OrderCreated events, and pkg/inbox applies each one
// exactly once: its inbox row, a ledger entry and the customer's projection commit in one
// transaction, and a record is reported successful only after that commit.
//
// Configuration (read once per cold start, see internal/lambdaenv): DATABASE_URL, or
// DATABASE_SECRET_ARN naming the RDS Secrets Manager secret; DATABASE_MAX_CONNS;
// SLUICE_CONSUMER_NAME (default "orders-ledger"); SLUICE_CONSUMER_COMMIT_MODE (per-record or
// batched). AWS clients honour AWS_ENDPOINT_URL.
//
// Build: GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -o bin/consumer/bootstrap ./lambdas/consumer
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/lambdaenv"
	"github.com/sluicehq/sluice/pkg/inbox"
)

// defaultConsumerName is SLUICE_CONSUMER_NAME's default.
const defaultConsumerName = "orders-ledger"

func main() {
	log := lambdaenv.Logger(os.Getenv, "consumer")
	c, pool, err := wire(context.Background(), os.Getenv, log)
	if err != nil {
		log.Error("consumer cold start failed", "error", err)
		os.Exit(1)
	}
	lambda.StartWithOptions(c.HandleSQS, lambda.WithEnableSIGTERM(pool.Close))
}

// wire builds everything once per cold start: database pool, the demo tables, router, consumer.
func wire(ctx context.Context, getenv lambdaenv.Getenv, log *slog.Logger) (*inbox.Consumer, *pgxpool.Pool, error) {
	pool, err := lambdaenv.OpenPool(ctx, getenv)
	if err != nil {
		return nil, nil, err
	}
	c, err := newConsumer(ctx, pool, getenv, log)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return c, pool, nil
}

// newConsumer ensures the demo tables exist and builds the inbox consumer over pool.
func newConsumer(ctx context.Context, pool *pgxpool.Pool, getenv lambdaenv.Getenv, log *slog.Logger) (*inbox.Consumer, error) {
	if err := demoapp.ApplySchema(ctx, pool); err != nil {
		return nil, err
	}
	mode, err := inbox.ParseMode(getenv(lambdaenv.ConsumerCommitMode))
	if err != nil {
		return nil, err
	}
	name := getenv(lambdaenv.ConsumerName)
	if name == "" {
		name = defaultConsumerName
	}
	router := inbox.NewRouter(inbox.FailUnknown)
	router.Handle(demoapp.EventOrderCreated, orderCreated)
	c, err := inbox.New(pool, inbox.Config{Consumer: name, Router: router, Mode: mode, Metrics: os.Stdout, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("create inbox consumer: %w", err)
	}
	return c, nil
}
