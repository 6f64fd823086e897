// Command relay is sluice's relay Lambda. An EventBridge schedule invokes it (once a minute is
// EventBridge's floor); each invocation drains the outbox and keeps polling for new rows (every
// 50 ms by default) until SLUICE_RELAY_STOP_BEFORE (default 5s) before its deadline, so events
// are published well within a second although the schedule fires once a minute. Overlapping
// invocations are safe (each round holds its partition keys' advisory locks).
//
// Configuration (read once per cold start, see pkg/lambdaenv): DATABASE_URL, or
// DATABASE_SECRET_ARN naming the RDS Secrets Manager secret; DATABASE_MAX_CONNS;
// SLUICE_TOPIC_ARNS and SLUICE_DEFAULT_TOPIC_ARN; SLUICE_RELAY_STOP_BEFORE and the relay
// settings declared in outbox.RelaySettings (SLUICE_RELAY_BATCH_SIZE, SLUICE_RELAY_LEASE, ...;
// docs/outbox.md lists them), read by lambdaenv.RelayConfig;
// SLUICE_OUTBOX_RETENTION and SLUICE_OUTBOX_PARTITION_INTERVAL, when set, make each invocation
// maintain a partitioned outbox_event (create partitions ahead, drop expired ones with a
// retention), which needs the owner's privileges; unset, the relay does no DDL (the CDK stack
// maintains partitions from the migrate function). A setting out of range stops the cold start
// with an error naming it. AWS clients honour AWS_ENDPOINT_URL. OTEL_TRACES_EXPORTER=console
// records a span per PublishBatch call as JSON lines in the log (pkg/lambdatrace;
// docs/tracing.md for OTLP and X-Ray).
//
// Fleet mode: with SLUICE_FLEET_TENANTS, SLUICE_FLEET_REGISTRY_URL or
// SLUICE_FLEET_REGISTRY_SECRET_ARN set, one function serves a fleet of tenant databases
// (pkg/fleet; the variables in pkg/lambdaenv/fleet.go) instead of DATABASE_URL's.
//
// Build: GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -o bin/relay/bootstrap ./lambdas/relay
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/lambdatrace"
	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

func main() {
	log := lambdaenv.Logger(os.Getenv, "relay")
	if lambdaenv.FleetEnabled(os.Getenv) {
		startFleet(log)
		return
	}
	h, pool, stopTracing, err := wire(context.Background(), os.Getenv, log)
	if err != nil {
		log.Error("relay cold start failed", "error", err)
		os.Exit(1)
	}
	lambda.StartWithOptions(h.Handle, lambda.WithEnableSIGTERM(pool.Close, stopTracing))
}

// wire builds everything once per cold start: AWS config, database pool, SNS publisher, the
// tracer provider the environment asks for (none by default), relay. stopTracing flushes the
// tracer provider.
func wire(ctx context.Context, getenv lambdaenv.Getenv, log *slog.Logger) (h *handler, pool *pgxpool.Pool, stopTracing func(), err error) {
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load AWS config: %w", err)
	}
	tp, stop, err := lambdatrace.Setup(getenv, os.Stdout, "sluice-relay")
	if err != nil {
		return nil, nil, nil, err
	}
	pool, err = lambdaenv.OpenPool(ctx, getenv)
	if err != nil {
		return nil, nil, nil, err
	}
	relayCfg, stopBefore, err := relayConfig(getenv)
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	pub, closePub, err := lambdaenv.RelayPublisher(ctx, getenv, awsCfg, relayCfg.Destinations())
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	relayCfg.Publisher = pub
	if relayCfg.ClaimCheck, err = lambdaenv.ClaimCheck(getenv, awsCfg); err != nil {
		pool.Close()
		closePub()
		return nil, nil, nil, err
	}
	stopTracing = func() { _ = stop(context.Background()); closePub() }
	relayCfg.Metrics = os.Stdout
	relayCfg.TracerProvider = tp
	relayCfg.Logger = log
	relay, err := outbox.NewRelay(pool, relayCfg)
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	parts, err := partitionOptions(getenv)
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return &handler{relay: relay, lag: pool, stopBefore: stopBefore, log: log, db: pool, partitions: parts}, pool, stopTracing, nil
}

// partitionOptions reads the maintenance of a partitioned outbox_event
// (lambdaenv.Partitions): nil, no maintenance, unless SLUICE_OUTBOX_RETENTION or
// SLUICE_OUTBOX_PARTITION_INTERVAL is set. Creating and dropping partitions needs the table
// owner's privileges, which the relay's own role does not have: the CDK constructs maintain
// partitions from the migrate function instead and set these only on a relay that logs in as
// the owner.
func partitionOptions(getenv lambdaenv.Getenv) (*partition.Options, error) {
	return lambdaenv.Partitions(getenv, partition.Outbox)
}

// relayConfig reads the relay's settings from the environment (lambdaenv.RelayConfig, without
// the Publisher, Metrics and Logger, which need clients) and the stop-before margin.
func relayConfig(getenv lambdaenv.Getenv) (outbox.RelayConfig, time.Duration, error) {
	cfg, err := lambdaenv.RelayConfig(getenv)
	if err != nil {
		return cfg, 0, err
	}
	stopBefore, err := lambdaenv.Duration(getenv, lambdaenv.RelayStopBefore, lambdaenv.DefaultRelayStopBefore)
	if err != nil {
		return cfg, 0, err
	}
	return cfg, stopBefore, nil
}
