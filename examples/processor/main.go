// Command processor runs the inbox's asynchronous Processor as a long-running process (an ECS
// service, a Kubernetes Deployment): a consumer in async mode only stores each message in
// inbox_event and acknowledges it, and this process applies the stored rows with your handlers,
// each in its own transaction, retrying with backoff and parking a row after
// SLUICE_PROCESSOR_MAX_ATTEMPTS failures (default 5; `sluice dead list` shows it).
//
// Environment: SLUICE_CONSUMER_NAME (required: the consumer whose rows it applies),
// DATABASE_URL or DATABASE_SECRET_ARN, DATABASE_MAX_CONNS (default 4: the processor applies one
// row at a time, so one connection works and the rest serve the probes and metrics),
// SLUICE_HEALTH_ADDR (default :8080: GET /healthz for liveness, GET /readyz for readiness).
//
// On SIGTERM it stops claiming rows, lets the row being applied commit or roll back (a row
// rolled back is applied again later: its inbox row keeps it exactly once), closes its sessions
// and exits 0. Several copies may run at once: rows are claimed with FOR UPDATE SKIP LOCKED,
// and a FIFO group's rows are applied in order by one of them at a time.
//
// Copy this directory, register your handlers in [handlers], and deploy it beside the
// consumer's Lambda (docs/deploy.md, "Outside Lambda").
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/examples/internal/health"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// handlers is where a team registers its handlers: one Handle call per event type. Each runs
// inside the transaction that marks the stored row processed: write through tx, never commit it.
func handlers(log *slog.Logger) *inbox.Router {
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var order struct {
			OrderID string `json:"orderId"`
		}
		if err := msg.Decode(&order); err != nil {
			return err
		}
		// Replace with your effects, through tx.
		_, err := tx.Exec(ctx, `INSERT INTO example_invoice (order_id, message_id) VALUES ($1, $2)`, order.OrderID, msg.ID)
		log.InfoContext(ctx, "invoice created", "messageId", msg.ID, "orderId", order.OrderID)
		return err
	})
	return r
}

func main() { health.Main("processor", run) }

// run applies stored rows until ctx ends, then stops cleanly.
func run(ctx context.Context, getenv lambdaenv.Getenv, log *slog.Logger) error {
	cfg, err := lambdaenv.ProcessorConfig(getenv) // before any connection: a bad setting costs nothing
	if err != nil {
		return err
	}
	cfg.Logger, cfg.Metrics = log, os.Stdout
	pool, err := lambdaenv.OpenPool(ctx, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The example's own table; your service has its tables already.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_invoice (order_id text PRIMARY KEY, message_id text NOT NULL)`); err != nil {
		return fmt.Errorf("create the example's table: %w", err)
	}
	cfg.Router = handlers(log)
	p, err := inbox.NewProcessor(pool, cfg)
	if err != nil {
		return err
	}
	probes, err := health.ServeFrom(getenv, func(ctx context.Context) error { return pool.Ping(ctx) }, log)
	if err != nil {
		return err
	}
	defer probes.Close()
	log.Info("processor started", "health", probes.Addr(), "consumer", cfg.Consumer, "pool_max_conns", pool.Config().MaxConns)

	err = p.Run(ctx)
	probes.Stopping()
	log.Info("processor stopped", "reason", context.Cause(ctx))
	if ctx.Err() != nil {
		return nil // stopped as asked
	}
	return err
}
