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
// Every consumer is also the inbox Processor of its own stored rows: an EventBridge schedule (the
// CDK construct adds it for every consumer) invokes the same function every minute, and each
// scheduled invocation applies the consumer's unprocessed inbox_event rows with the same handlers.
// In the async commit mode (SLUICE_CONSUMER_COMMIT_MODE=async) the event source's invocations
// only store each message in inbox_event and acknowledge it, and the scheduled invocation runs
// the processor until SLUICE_CONSUMER_DEADLINE_MARGIN before its deadline. In the per-record and
// batched modes stored rows come only from `sluice dead retry` (inbox.RetryDeadLetters stores a
// dead letter as the async mode would), so the scheduled invocation drains what is ready once
// and returns (one claim query when there is nothing). One binary, one set of handlers, so the
// roles cannot drift apart.
//
// Fleet mode: when SLUICE_FLEET_TENANTS, SLUICE_FLEET_REGISTRY_URL or
// SLUICE_FLEET_REGISTRY_SECRET_ARN names a fleet of tenant databases (pkg/fleet), each message
// is applied in the database of the tenant its fleet relay named (the sluiceTenant header),
// with a pool per tenant of at most SLUICE_CONSUMER_TENANT_MAX_CONNS connections and
// SLUICE_CONSUMER_FLEET_MAX_CONNS in all (lambdaenv.OpenConsumerFleet), and the schedule's
// invocation drains every tenant's stored rows. A message of no known tenant fails and reaches
// the DLQ. See docs/inbox.md, "Fleet: one consumer, many tenant databases".
//
// Configuration (read once per cold start by lambdaenv.ConsumerConfig and lambdaenv.OpenPool):
// SLUICE_CONSUMER_NAME (required), SLUICE_CONSUMER_COMMIT_MODE (per-record, batched or async),
// SLUICE_PROCESSOR_MAX_ATTEMPTS (attempts before a stored row is parked),
// SLUICE_CONSUMER_DEADLINE_MARGIN, SLUICE_CONSUMER_STORE_PAYLOAD, SLUICE_CONSUMER_MAX_RECEIVE_COUNT
// and SLUICE_CONSUMER_STREAM_MAX_ATTEMPTS (the source's attempts: the last failure marks a dead
// letter dead); SLUICE_CLAIM_CHECK_BUCKET and SLUICE_CLAIM_CHECK_MAX_PAYLOAD (fetch payloads a
// claim check stored in S3, lambdaenv.ConsumerClaimCheck); DATABASE_URL, or DATABASE_SECRET_ARN
// naming the RDS Secrets Manager secret; DATABASE_MAX_CONNS. AWS clients
// honour AWS_ENDPOINT_URL. OTEL_TRACES_EXPORTER=console records a consumer span per record, a
// child of the span that wrote the event, as JSON lines in the log (pkg/lambdatrace; see
// docs/tracing.md to export to X-Ray or any OTLP backend instead).
//
// Build: GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -o bin/consumer/bootstrap ./lambdas/consumer
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

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
	h, closeDB, err := newHandler(ctx, cfg, os.Getenv, log)
	if err != nil {
		log.Error("consumer cold start failed", "error", err)
		os.Exit(1)
	}
	lambda.StartWithOptions(h.Handle, lambda.WithEnableSIGTERM(closeDB, func() { _ = stopTracing(context.Background()) }))
}

// newHandler opens the database(s) and builds the consumer and its processor: on one database
// (lambdaenv.OpenPool), or, when the environment names a fleet (lambdaenv.FleetEnabled), on each
// message's tenant database (lambdaenv.OpenConsumerFleet: inbox.ConsumerConfig.Tenants, and an
// inbox.TenantProcessor that drains every tenant's stored rows). closeDB closes what it opened.
func newHandler(ctx context.Context, cfg inbox.ConsumerConfig, getenv lambdaenv.Getenv, log *slog.Logger) (h *handler, closeDB func(), err error) {
	h = &handler{async: cfg.Mode == inbox.Async, name: cfg.Consumer, margin: cfg.DeadlineMargin}
	fl, err := lambdaenv.OpenConsumerFleet(ctx, getenv, log) // nil without fleet settings
	if err != nil {
		return nil, nil, err
	}
	if fl != nil {
		cfg.Tenants = fl.Pools
		if h.consumer, err = newConsumer(nil, cfg, log); err == nil {
			h.processor, err = newTenantProcessor(fl, cfg, getenv, log)
		}
		if err != nil {
			fl.Close()
			return nil, nil, err
		}
		return h, fl.Close, nil
	}
	pool, err := lambdaenv.OpenPool(ctx, getenv)
	if err != nil {
		return nil, nil, err
	}
	if h.consumer, err = newConsumer(pool, cfg, log); err == nil {
		// Every mode: retried dead letters are stored rows, whatever the mode.
		h.processor, err = newProcessor(pool, cfg, getenv, log)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return h, pool.Close, nil
}

// processorConfig is the inbox processor's configuration: the consumer's stored rows (the async
// mode's messages, retried dead letters), applied with this file's handlers.
func processorConfig(cfg inbox.ConsumerConfig, getenv lambdaenv.Getenv, log *slog.Logger) (inbox.ProcessorConfig, error) {
	pcfg, err := lambdaenv.ProcessorConfig(getenv)
	if err != nil {
		return pcfg, err
	}
	pcfg.Router = handlers(log)
	pcfg.Metrics = os.Stdout
	pcfg.Logger = log
	pcfg.TracerProvider = cfg.TracerProvider
	return pcfg, nil
}

// newProcessor builds the inbox processor over db (processorConfig).
func newProcessor(db inbox.Beginner, cfg inbox.ConsumerConfig, getenv lambdaenv.Getenv, log *slog.Logger) (*inbox.Processor, error) {
	pcfg, err := processorConfig(cfg, getenv, log)
	if err != nil {
		return nil, err
	}
	p, err := inbox.NewProcessor(db, pcfg)
	if err != nil {
		return nil, fmt.Errorf("create inbox processor: %w", err)
	}
	return p, nil
}

// newTenantProcessor builds the fleet's processor (processorConfig): each tenant of the
// registry in turn, on its database.
func newTenantProcessor(fl *lambdaenv.ConsumerFleet, cfg inbox.ConsumerConfig, getenv lambdaenv.Getenv, log *slog.Logger) (*inbox.TenantProcessor, error) {
	pcfg, err := processorConfig(cfg, getenv, log)
	if err != nil {
		return nil, err
	}
	tenants := func(ctx context.Context) ([]string, error) {
		ts, err := fl.Registry.Tenants(ctx)
		names := make([]string, len(ts))
		for i, t := range ts {
			names[i] = t.Name
		}
		return names, err
	}
	p, err := inbox.NewTenantProcessor(fl.Pools, tenants, pcfg)
	if err != nil {
		return nil, fmt.Errorf("create the fleet's inbox processor: %w", err)
	}
	return p, nil
}

// handler routes an invocation: the event source's batches go to the inbox consumer; the
// schedule's events run the processor, until margin before the deadline for an async consumer,
// one Drain for the others.
type handler struct {
	consumer  *inbox.Consumer
	processor storedRows
	async     bool // the commit mode is async: every message is a stored row
	name      string
	margin    time.Duration
}

// storedRows applies the consumer's stored rows: an *inbox.Processor on one database, an
// *inbox.TenantProcessor on a fleet's.
type storedRows interface {
	Drain(ctx context.Context) (inbox.ProcessStats, error)
	Run(ctx context.Context) error
}

var (
	_ storedRows = (*inbox.Processor)(nil)
	_ storedRows = (*inbox.TenantProcessor)(nil)
)

// ProcessorRun is a scheduled invocation's response.
type ProcessorRun struct {
	Consumer string        `json:"consumer"`
	Ran      time.Duration `json:"ranNanoseconds"`
	// Applied counts the rows a single Drain applied (per-record and batched modes); an async
	// consumer's run reports its counts in its metrics only.
	Applied int `json:"applied,omitempty"`
}

// Handle serves one invocation.
func (h *handler) Handle(ctx context.Context, event json.RawMessage) (any, error) {
	if !inbox.IsScheduledEvent(event) {
		return h.consumer.HandleEvent(ctx, event)
	}
	start := time.Now()
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if deadline, ok := ctx.Deadline(); ok {
		runCtx, cancel = context.WithDeadline(ctx, deadline.Add(-max(h.margin, time.Second)))
	}
	defer cancel()
	if !h.async {
		// Stored rows are rare here (retried dead letters): apply what is ready and return, so
		// the schedule costs an invocation a minute, not a function running all the time. A
		// retried row that fails again is retried by the next minute's invocation, and parked
		// after its attempts.
		st, err := h.processor.Drain(runCtx)
		if err != nil && runCtx.Err() == nil {
			return nil, err
		}
		return ProcessorRun{Consumer: h.name, Ran: time.Since(start), Applied: st.Applied}, nil
	}
	if err := h.processor.Run(runCtx); err != nil && runCtx.Err() == nil {
		return nil, err
	}
	return ProcessorRun{Consumer: h.name, Ran: time.Since(start)}, nil
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
