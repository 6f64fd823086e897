package infra

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	sluiceoutbox "github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

// RelaySettings tune the relay Lambda. Each field becomes the environment variable the relay
// reads into the outbox.RelayConfig field of the same name (lambdaenv.RelayConfig, the one
// reader shared with `sluice relay`); a zero field is left unset, so the relay applies its own
// default, quoted on each field. Synthesis refuses what the relay would refuse at cold start.
type RelaySettings struct {
	// BatchSize is the most rows (and partition keys) one round takes
	// (SLUICE_RELAY_BATCH_SIZE). Defaults to outbox.DefaultBatchSize (500).
	BatchSize int
	// MaxPerKey is the most rows of one partition key a round takes (SLUICE_RELAY_MAX_PER_KEY).
	// Defaults to outbox.DefaultMaxPerKey (10).
	MaxPerKey int
	// PublishConcurrency is the number of PublishBatch calls in flight
	// (SLUICE_RELAY_PUBLISH_CONCURRENCY). Defaults to outbox.DefaultPublishConcurrency (64).
	PublishConcurrency int
	// Pipelines is the number of rounds one relay runs at once (SLUICE_RELAY_PIPELINES).
	// Defaults to outbox.DefaultPipelines (2).
	Pipelines int
	// MaxRoundBytes bounds the payload bytes one round holds (SLUICE_RELAY_MAX_ROUND_BYTES).
	// Defaults to the function's memory / (8 × Pipelines), at least 1 MiB.
	MaxRoundBytes int
	// MaxAttempts is the failed attempts after which a row is quarantined
	// (SLUICE_RELAY_MAX_ATTEMPTS). Defaults to outbox.DefaultMaxAttempts (10).
	MaxAttempts int
	// PublishTimeout bounds one PublishBatch call; shorter than Lease
	// (SLUICE_RELAY_PUBLISH_TIMEOUT). Defaults to outbox.DefaultPublishTimeout (10s).
	PublishTimeout time.Duration
	// Lease bounds how long one round holds its partition keys (SLUICE_RELAY_LEASE). Defaults
	// to outbox.DefaultLease (30s).
	Lease time.Duration
	// BackoffBase and BackoffMax bound the backoff between a row's attempts and between probes
	// of a failing destination (SLUICE_RELAY_BACKOFF_BASE, SLUICE_RELAY_BACKOFF_MAX). Default to
	// outbox.DefaultBackoffBase (1s) and outbox.DefaultBackoffMax (5m).
	BackoffBase, BackoffMax time.Duration
	// OutageLimit is how long a row may fail with its whole destination before it is
	// quarantined all the same (SLUICE_RELAY_OUTAGE_LIMIT). Defaults to
	// outbox.DefaultOutageLimit (24h).
	OutageLimit time.Duration
	// PollInterval is how often a relay looks for newly committed rows
	// (SLUICE_RELAY_POLL_INTERVAL). Defaults to outbox.DefaultPollInterval (50ms).
	PollInterval time.Duration
	// RescanInterval is how often a relay walks every pending partition key
	// (SLUICE_RELAY_RESCAN_INTERVAL). Defaults to outbox.DefaultRescanInterval (1s).
	RescanInterval time.Duration
}

// config is s as the outbox.RelayConfig fields it sets.
func (s RelaySettings) config() sluiceoutbox.RelayConfig {
	return sluiceoutbox.RelayConfig{
		BatchSize: s.BatchSize, MaxPerKey: s.MaxPerKey, PublishConcurrency: s.PublishConcurrency, Pipelines: s.Pipelines,
		MaxRoundBytes: s.MaxRoundBytes, MaxAttempts: s.MaxAttempts, PublishTimeout: s.PublishTimeout, Lease: s.Lease,
		BackoffBase: s.BackoffBase, BackoffMax: s.BackoffMax, OutageLimit: s.OutageLimit, PollInterval: s.PollInterval,
		RescanInterval: s.RescanInterval,
	}
}

// relayEnvironment returns the relay's setting variables for s, checked by the relay's own
// reader with memoryMB as the function's memory: an error is what the cold start would refuse.
func relayEnvironment(s RelaySettings, memoryMB int) (map[string]string, error) {
	env := lambdaenv.RelayEnvironment(s.config())
	read := maps.Clone(env)
	read[lambdaenv.LambdaMemorySize] = strconv.Itoa(memoryMB)
	if _, err := lambdaenv.RelaySettings(func(k string) string { return read[k] }); err != nil {
		return nil, fmt.Errorf("Relay: %w", err)
	}
	return env, nil
}

// consumerEnvironment returns the consumer's setting variables for its props, checked by the
// consumer Lambda's own reader (lambdaenv.ConsumerConfig): an error is what the cold start
// would refuse.
func consumerEnvironment(p *ConsumerProps) (map[string]string, error) {
	env := map[string]string{lambdaenv.ConsumerName: p.Name}
	if p.CommitMode != "" {
		env[lambdaenv.ConsumerCommitMode] = p.CommitMode
	}
	maps.Copy(env, lambdaenv.ConsumerEnvironment(inbox.Config{DeadlineMargin: p.DeadlineMargin, StorePayload: p.StorePayload}))
	if _, err := lambdaenv.ConsumerConfig(func(k string) string { return env[k] }); err != nil {
		return nil, fmt.Errorf("the consumer Lambda would refuse these settings at cold start: %w", err)
	}
	return env, nil
}

// maintenanceEnvironment returns the migrations function's partition maintenance variables
// (zero durations are left unset), checked by the function's own readers
// (lambdaenv.Partitions, for each table): an error is what its cold start would refuse.
func maintenanceEnvironment(outboxRetention, outboxInterval, inboxRetention, inboxInterval time.Duration) (map[string]string, error) {
	env := map[string]string{}
	for k, d := range map[string]time.Duration{
		lambdaenv.OutboxRetention: outboxRetention, lambdaenv.OutboxPartitionInterval: outboxInterval,
		lambdaenv.InboxRetention: inboxRetention, lambdaenv.InboxPartitionInterval: inboxInterval,
	} {
		if d > 0 {
			env[k] = d.String()
		}
	}
	get := func(k string) string { return env[k] }
	var errs []error
	for _, t := range partition.Tables() {
		_, err := lambdaenv.Partitions(get, t)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("partition maintenance: %w", err)
	}
	return env, nil
}
