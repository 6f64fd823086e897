package lambdaenv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// The relay's settings are declared in outbox.RelaySettings, each with its variable
// (SLUICE_RELAY_BATCH_SIZE, SLUICE_SNS_MAX_MESSAGE_BYTES, ...): RelaySettings reads them all, so
// a new entry there is read here without a change. These are the relay's other variables.
const (
	// RelayStopBefore is how long before the Lambda deadline the relay stops claiming (Go
	// duration). Defaults to DefaultRelayStopBefore.
	RelayStopBefore = "SLUICE_RELAY_STOP_BEFORE"
	// LambdaMemorySize is set by Lambda: the function's memory in MB. The relay's
	// MaxRoundBytes defaults to it divided by 8 × Pipelines, so that every round's payloads and
	// their copies in flight fit the function.
	LambdaMemorySize = "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"
	// RelayWALPublication turns the WAL wake-up on (outbox.WALWake): the publication of
	// outbox_event's inserts a long-running relay follows instead of polling (outbox's
	// PublicationSQL creates it, e.g. sluice_outbox). Unset, the relay polls. RunOnce (the
	// relay Lambda) always polls.
	RelayWALPublication = "SLUICE_RELAY_WAL_PUBLICATION"
)

// DefaultRelayStopBefore is SLUICE_RELAY_STOP_BEFORE's default.
const DefaultRelayStopBefore = 5 * time.Second

// FleetShardOverlap is how long a fleet shard's relay invocation keeps serving after the next
// one's scheduled start: the CDK's OutboxFleet gives each shard's function a timeout of its
// schedule's period + FleetShardOverlap + the stop-before margin, so that the next invocation,
// started by the schedule, has started (a cold start included) before the last one stops and
// the shard serves its tenants every second of every minute. Two invocations serve at once for
// that long, each with its own fleet and budget; each round's claim keeps order and
// exactly-once between them, as between any overlapping relays.
const FleetShardOverlap = 10 * time.Second

// RelayConfig builds the relay's configuration from the environment (without Publisher,
// ClaimCheck, Metrics and Logger, which need clients): the topics (Topics) and the settings
// (RelaySettings). The relay Lambda reads it; `sluice relay` reads the same two parts.
func RelayConfig(getenv Getenv) (outbox.RelayConfig, error) {
	topics, def, topicErr := Topics(getenv)
	cfg, err := RelaySettings(getenv)
	if err := errors.Join(topicErr, err); err != nil {
		return outbox.RelayConfig{}, err
	}
	cfg.Topics, cfg.DefaultTopic = topics, def
	if pub := getenv(RelayWALPublication); pub != "" {
		cfg.WAL = &outbox.WALWake{Publication: pub}
	}
	return cfg, nil
}

// RoundMemory is the round memory one relay process shares between its relays
// (outbox.RelayConfig.RoundMemory) in Lambda: the function's memory (LambdaMemorySize) ÷ 8,
// what MaxRoundBytes's default gives all of one relay's rounds, so that a process running many
// relays (the fleet: up to a server's budget of pipelines at once) holds no more payloads than
// one relay does. Nil outside Lambda (LambdaMemorySize unset): the fleet's default applies.
func RoundMemory(getenv Getenv) *outbox.RoundMemory {
	mb, err := strconv.Atoi(getenv(LambdaMemorySize))
	if err != nil || mb <= 0 {
		return nil
	}
	return outbox.NewRoundMemory(mb << 20 / 8)
}

// RelaySettings reads the variable of every entry of outbox.RelaySettings (but the claim
// check's, which ClaimCheck reads), not the topics, checked against outbox's bounds. An unset
// variable leaves its field zero (outbox's default), but for MaxRoundBytes in Lambda (see
// LambdaMemorySize). Every problem is reported at once, each naming its variable.
func RelaySettings(getenv Getenv) (outbox.RelayConfig, error) {
	var cfg outbox.RelayConfig
	errs := readSettings(getenv, &cfg, func(s outbox.Setting) bool { return !strings.HasPrefix(s.Field, "ClaimCheck.") })
	if cfg.MaxRoundBytes == 0 {
		if mb, err := strconv.Atoi(getenv(LambdaMemorySize)); err == nil && mb > 0 {
			pipelines := cfg.Pipelines
			if pipelines == 0 {
				pipelines = int(outbox.RelaySetting("Pipelines").Default)
			}
			cfg.MaxRoundBytes = max(mb<<20/(8*pipelines), 1<<20)
		}
	}
	if len(errs) == 0 {
		errs = append(errs, nameVariables(cfg.CheckSettings())...)
	}
	if err := errors.Join(errs...); err != nil {
		return outbox.RelayConfig{}, fmt.Errorf("relay settings: %w", err)
	}
	return cfg, nil
}

// readSettings sets cfg's field of each setting that has a variable and passes keep, from the
// variable when it is set; it reports the values that cannot be read, naming the variable.
func readSettings(getenv Getenv, cfg *outbox.RelayConfig, keep func(outbox.Setting) bool) []error {
	var errs []error
	for _, s := range outbox.RelaySettings() {
		if s.Env == "" || !keep(s) {
			continue
		}
		raw := getenv(s.Env)
		if raw == "" {
			continue
		}
		v, err := s.Parse(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %w", s.Env, err))
			continue
		}
		s.Set(cfg, v)
	}
	return errs
}

// nameVariables turns outbox's field errors ("BatchSize must be ...") into errors naming the
// environment variable that set the field.
func nameVariables(err error) []error {
	if err == nil {
		return nil
	}
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	envOf := map[string]string{}
	for _, s := range outbox.RelaySettings() {
		envOf[s.Field] = s.Env
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		field, _, _ := strings.Cut(e.Error(), " ")
		if env := envOf[field]; env != "" {
			e = fmt.Errorf("%s: %w", env, e)
		}
		out = append(out, e)
	}
	return out
}
