// Command ledger is the consumer Lambda of `make demo` and the end-to-end tests: the demo's
// ledger service applies each OrderCreated event of internal/demoapp's orders service exactly
// once, appending a ledger entry and updating the customer's balance in the inbox transaction.
// It is built and run like lambdas/consumer (the skeleton to copy), with the demo's additions:
// it creates the demo tables at cold start, and it obeys fault-injection fields of the demo
// payload (fail_attempts, hold_ms) that the end-to-end tests set. Neither belongs in a real
// consumer.
//
// Configuration: as lambdas/consumer (lambdaenv.ConsumerConfig, lambdaenv.OpenPool,
// OTEL_TRACES_EXPORTER through lambdatrace.Setup: `make demo` sets it to console to draw one
// order's trace).
//
// Build: go build -tags lambda.norpc -trimpath -o bootstrap ./examples/ledger
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/lambdatrace"
)

func main() {
	ctx := context.Background()
	log := lambdaenv.Logger(os.Getenv, "ledger")
	cfg, err := lambdaenv.ConsumerConfig(os.Getenv)
	if err != nil {
		log.Error("ledger cold start failed", "error", err)
		os.Exit(1)
	}
	// Payloads a claim check stored in S3 are fetched before the handlers run (SLUICE_CLAIM_CHECK_BUCKET).
	if cfg.ClaimCheck, err = lambdaenv.ConsumerClaimCheck(ctx, os.Getenv); err != nil {
		log.Error("ledger cold start failed", "error", err)
		os.Exit(1)
	}
	tp, stopTracing, err := lambdatrace.Setup(os.Getenv, os.Stdout, "ledger")
	if err != nil {
		log.Error("ledger cold start failed", "error", err)
		os.Exit(1)
	}
	cfg.TracerProvider = tp
	pool, err := lambdaenv.OpenPool(ctx, os.Getenv)
	if err != nil {
		log.Error("ledger cold start failed", "error", err)
		os.Exit(1)
	}
	c, err := newConsumer(ctx, pool, cfg, log)
	if err != nil {
		pool.Close()
		log.Error("ledger cold start failed", "error", err)
		os.Exit(1)
	}
	p, err := newProcessor(pool, cfg, log)
	if err != nil {
		pool.Close()
		log.Error("ledger cold start failed", "error", err)
		os.Exit(1)
	}
	// HandleEvent: the same binary serves the demo's SQS queue and, with -transport kafka, the
	// local Kafka event source mapping (internal/localrun); the processor schedule's events
	// apply the rows stored for it (dead letters `sluice dead retry` stored).
	h := func(ctx context.Context, event json.RawMessage) (any, error) {
		if inbox.IsScheduledEvent(event) {
			st, err := p.Drain(ctx)
			return st, err
		}
		return c.HandleEvent(ctx, event)
	}
	lambda.StartWithOptions(h, lambda.WithEnableSIGTERM(pool.Close, func() { _ = stopTracing(context.Background()) }))
}

// newProcessor builds the inbox processor that applies the ledger's stored rows with the same
// handler.
func newProcessor(pool demoapp.Beginner, cfg inbox.ConsumerConfig, log *slog.Logger) (*inbox.Processor, error) {
	p, err := inbox.NewProcessor(pool, inbox.ProcessorConfig{Consumer: cfg.Consumer, Router: router(), Metrics: os.Stdout, Logger: log,
		TracerProvider: cfg.TracerProvider})
	if err != nil {
		return nil, fmt.Errorf("create inbox processor: %w", err)
	}
	return p, nil
}

// router maps the ledger's one event type to its handler.
func router() *inbox.Router {
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle(demoapp.EventOrderCreated, orderCreated)
	return r
}

// newConsumer ensures the demo tables exist and builds the inbox consumer over pool.
func newConsumer(ctx context.Context, pool demoapp.Beginner, cfg inbox.ConsumerConfig, log *slog.Logger) (*inbox.Consumer, error) {
	if err := demoapp.ApplySchema(ctx, pool); err != nil {
		return nil, err
	}
	cfg.Router, cfg.Metrics, cfg.Logger = router(), os.Stdout, log
	c, err := inbox.NewConsumer(pool, cfg)
	if err != nil {
		return nil, fmt.Errorf("create inbox consumer: %w", err)
	}
	return c, nil
}

// orderCreated applies an OrderCreated event inside the inbox transaction tx. It never commits;
// returning an error rolls everything back (the inbox row included) and the record comes back
// from SQS.
func orderCreated(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
	var o demoapp.OrderCreated
	if err := msg.Decode(&o); err != nil {
		return err
	}
	// Test hooks carried by the payload (absent in normal traffic): a transient failure for the
	// first deliveries (SQS counts them; Kafka and Kinesis do not, so there it fails every one),
	// and a transaction held open so tests can cut the connection mid-way.
	if o.FailAttempts > 0 && msg.ReceiveCount <= o.FailAttempts {
		return fmt.Errorf("order %s: injected transient failure (delivery %d of the first %d)", o.OrderID, msg.ReceiveCount, o.FailAttempts)
	}
	if o.HoldMillis > 0 {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8 / 1000)", o.HoldMillis); err != nil {
			return fmt.Errorf("order %s: hold transaction: %w", o.OrderID, err)
		}
	}
	return applyOrderCreated(ctx, tx, msg.ID, o)
}

// applyOrderCreated is the ledger's effect: it validates the currency against reference data,
// appends a ledger entry and updates the customer's projection, all through tx.
func applyOrderCreated(ctx context.Context, tx pgx.Tx, messageID string, o demoapp.OrderCreated) error {
	tag, err := tx.Exec(ctx, `INSERT INTO demo_ledger (message_id, order_id, customer, seq, amount_cents, currency)
		SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM demo_currencies WHERE code = $6)`,
		messageID, o.OrderID, o.Customer, o.Seq, o.AmountCents, o.Currency)
	if err != nil {
		return fmt.Errorf("append ledger entry for order %s: %w", o.OrderID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("order %s: unknown currency %q", o.OrderID, o.Currency)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO demo_customer_balance (customer, orders, total_cents, last_seq, updated_at)
		VALUES ($1, 1, $2, $3, clock_timestamp())
		ON CONFLICT (customer) DO UPDATE SET orders = demo_customer_balance.orders + 1,
			total_cents = demo_customer_balance.total_cents + EXCLUDED.total_cents,
			last_seq = greatest(demo_customer_balance.last_seq, EXCLUDED.last_seq), updated_at = EXCLUDED.updated_at`,
		o.Customer, o.AmountCents, o.Seq); err != nil {
		return fmt.Errorf("update balance of %s: %w", o.Customer, err)
	}
	return nil
}
