package infra

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
	sluiceoutbox "github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

// RelaySettings tune the relay Lambda. Each field is the outbox.RelayConfig field of the same
// name, declared in outbox.RelaySettings with its variable, default and bounds (the table in
// docs/outbox.md); a zero field is left unset, so the relay applies its own default.
// Synthesis refuses what the relay would refuse at cold start. A field added here must be
// named after an entry of outbox.RelaySettings (the tests check it).
type RelaySettings struct {
	// BatchSize is the most rows (and partition keys) one round takes. Defaults to 500.
	BatchSize int
	// MaxPerKey is the most rows of one partition key a round takes. Defaults to 10.
	MaxPerKey int
	// PublishConcurrency is the number of PublishBatch calls in flight. Defaults to 64.
	PublishConcurrency int
	// Pipelines is the number of rounds one relay runs at once. Defaults to 2.
	Pipelines int
	// MaxRoundBytes bounds the payload bytes one round holds. Defaults to the function's
	// memory / (8 × Pipelines), at least 1 MiB.
	MaxRoundBytes int
	// MaxAttempts is the failed attempts after which a row is quarantined. Defaults to 10.
	MaxAttempts int
	// PublishTimeout bounds one PublishBatch call; shorter than Lease. Defaults to 10s.
	PublishTimeout time.Duration
	// SlowCall is how long a call may be in flight before its destination counts as slow and
	// stops holding a pipeline (docs/outbox.md, "Liveness"). Defaults to 250ms.
	SlowCall time.Duration
	// Lease bounds how long one round holds its partition keys. Defaults to 30s.
	Lease time.Duration
	// BackoffBase is the first backoff between a row's attempts and between probes of a
	// failing destination. Defaults to 1s.
	BackoffBase time.Duration
	// BackoffMax is the longest backoff. Defaults to 5m.
	BackoffMax time.Duration
	// OutageLimit is how long a row may fail with its whole destination before it is
	// quarantined all the same. Defaults to 24h.
	OutageLimit time.Duration
	// PollInterval is how often a relay looks for newly committed rows. Defaults to 50ms.
	PollInterval time.Duration
	// RescanInterval is how often a relay walks every pending partition key. Defaults to 1s.
	RescanInterval time.Duration
	// IdleStop is the idle mode, for quiet outboxes: an invocation ends once it has claimed
	// nothing for this long, instead of polling until its timeout, so an idle outbox costs one
	// short invocation per schedule period; the first event after a quiet spell then waits up
	// to one period (a minute) for the next invocation. Under traffic nothing changes.
	// Defaults to 0: each invocation polls until SLUICE_RELAY_STOP_BEFORE ahead of its timeout.
	IdleStop time.Duration
}

// environment returns the variable of each non-zero field of s (outbox.RelaySetting of the
// field's name), as the relay reads it.
func (s RelaySettings) environment() map[string]string {
	env := map[string]string{}
	v := reflect.ValueOf(s)
	for i := range v.NumField() {
		setting := sluiceoutbox.RelaySetting(v.Type().Field(i).Name)
		if n := v.Field(i).Int(); n != 0 { // int or time.Duration
			env[setting.Env] = setting.Text(n)
		}
	}
	return env
}

// relayEnvironment returns the relay's setting variables for s, checked by the relay's own
// reader with memoryMB as the function's memory: an error is what the cold start would refuse.
func relayEnvironment(s RelaySettings, memoryMB int) (map[string]string, error) {
	env := s.environment()
	read := maps.Clone(env)
	read[lambdaenv.LambdaMemorySize] = strconv.Itoa(memoryMB)
	if _, err := lambdaenv.RelaySettings(func(k string) string { return read[k] }); err != nil {
		return nil, fmt.Errorf("Relay: %w", err)
	}
	return env, nil
}

// consumerEnvironment returns the consumer's setting variables for its props, checked by the
// consumer Lambda's own readers (lambdaenv.ConsumerConfig, and a fleet consumer's
// lambdaenv.ConsumerTenantPoolsConfig): an error is what the cold start would refuse. A fleet
// consumer's registry variables come from its fleet (fleetTenancy.environment).
func consumerEnvironment(p *ConsumerProps) (map[string]string, error) {
	env := map[string]string{lambdaenv.ConsumerName: p.Name}
	if p.CommitMode != "" {
		env[lambdaenv.ConsumerCommitMode] = p.CommitMode
	}
	if p.DeadlineMargin != 0 && p.DeadlineMargin != lambdaenv.DefaultConsumerDeadlineMargin {
		env[lambdaenv.ConsumerDeadlineMargin] = p.DeadlineMargin.String()
	}
	if p.StorePayload { // the default is false
		env[lambdaenv.ConsumerStorePayload] = "true"
	}
	// The source's attempts, always stated, so that the consumer marks a dead letter dead on
	// the attempt after which its source gives up, whatever the inbox's defaults.
	if p.streamSource() {
		env[lambdaenv.ConsumerStreamMaxAttempts] = strconv.Itoa(p.streamRetryAttempts() + 1)
	} else {
		env[lambdaenv.ConsumerMaxReceiveCount] = strconv.Itoa(p.MaxReceiveCount)
	}
	// A fleet consumer's pool bounds, always stated: the servers' budgets booked these values.
	if f := p.Fleet; f != nil {
		env[lambdaenv.ConsumerTenantMaxConns] = strconv.Itoa(f.TenantMaxConns)
		env[lambdaenv.ConsumerFleetMaxConns] = strconv.Itoa(f.MaxConns)
	}
	get := func(k string) string { return env[k] }
	_, err := lambdaenv.ConsumerConfig(get)
	if err == nil && p.Fleet != nil {
		_, err = lambdaenv.ConsumerTenantPoolsConfig(get)
	}
	if err != nil {
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
