// Command relay runs sluice's relay as a long-running process, for teams whose relay must run
// continuously (an ECS service, a Kubernetes Deployment) rather than as the scheduled Lambda.
// It reads the relay Lambda's configuration from the same environment variables (pkg/lambdaenv:
// DATABASE_URL or DATABASE_SECRET_ARN, SLUICE_TOPIC_ARNS, SLUICE_DEFAULT_TOPIC_ARN, every
// SLUICE_RELAY_* setting) and adds:
//
//   - SLUICE_HEALTH_ADDR (default :8080): GET /healthz answers 200 while the process runs
//     (liveness), GET /readyz 200 while the database answers and the relay is not stopping
//     (readiness).
//   - DATABASE_MAX_CONNS: the pool's size. Unset, it is RelayConfig.PoolSize() + 1 (at least
//     4): one connection per pipeline's round, as many for rounds a slow destination detached
//     from their pipelines, one for polling and the key walk, one for metrics.
//   - SLUICE_RELAY_WAL_PUBLICATION (pkg/lambdaenv; unset: poll): follow the WAL for new rows
//     through this publication (docs/outbox.md, "WAL wake-up"), on one more connection, a
//     replication one, beside the pool; it falls back to polling whenever it cannot.
//
// On SIGTERM (what ECS and Kubernetes send before stopping a task) it stops taking rounds,
// lets the rounds in flight end as the relay Lambda's do at its deadline (what the broker
// acknowledged is marked published; anything else stays pending for the next relay), closes its
// database sessions, which releases every partition key they held, and exits 0. Give the task a
// stop timeout above SLUICE_RELAY_LEASE (default 30s), the longest a round may hold its keys.
// Several copies may run at once, beside the Lambda or not: each round holds its keys'
// advisory locks.
//
// Metrics are EMF lines on stdout (CloudWatch Logs turns them into metrics on ECS with the awslogs
// driver); logs are JSON on stderr. docs/deploy.md, "Outside Lambda", has the task definition.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/sluicehq/sluice/examples/internal/health"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func main() { health.Main("relay", run) }

// run relays until ctx ends, then stops cleanly.
func run(ctx context.Context, getenv lambdaenv.Getenv, log *slog.Logger) error {
	cfg, err := lambdaenv.RelayConfig(getenv) // before any connection: a bad setting costs nothing
	if err != nil {
		return err
	}
	pool, err := lambdaenv.OpenPool(ctx, withPoolSize(getenv, cfg.PoolSize()))
	if err != nil {
		return err
	}
	defer pool.Close() // closing the sessions releases every key they held
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return fmt.Errorf("load AWS config: %w", err)
	}
	pub, closePub, err := lambdaenv.RelayPublisher(ctx, getenv, awsCfg, cfg.Destinations())
	if err != nil {
		return err
	}
	defer closePub()
	cfg.Publisher = pub
	if cfg.ClaimCheck, err = lambdaenv.ClaimCheck(getenv, awsCfg); err != nil {
		return err
	}
	cfg.Metrics = os.Stdout
	cfg.Logger = log
	relay, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		return err
	}

	probes, err := health.ServeFrom(getenv, func(ctx context.Context) error { return pool.Ping(ctx) }, log)
	if err != nil {
		return err
	}
	defer probes.Close()
	log.Info("relay started", "health", probes.Addr(), "pool_max_conns", pool.Config().MaxConns, "pipelines", cfg.Pipelines)

	err = relay.Run(ctx) // returns once ctx ended and the rounds in flight are over
	probes.Stopping()
	log.Info("relay stopped", "reason", context.Cause(ctx))
	return err
}

// withPoolSize gives DATABASE_MAX_CONNS a default that fits the relay's pipelines.
func withPoolSize(getenv lambdaenv.Getenv, poolSize int) lambdaenv.Getenv {
	if getenv(lambdaenv.DatabaseMaxConns) != "" {
		return getenv
	}
	size := strconv.Itoa(max(4, poolSize+1)) // and one for the health check's ping
	return func(k string) string {
		if k == lambdaenv.DatabaseMaxConns {
			return size
		}
		return getenv(k)
	}
}
