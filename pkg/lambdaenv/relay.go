package lambdaenv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// Relay settings beyond those in lambdaenv.go. Each overrides the outbox.RelayConfig field of
// the same name; unset, the field takes outbox's default (outbox.Default*).
const (
	// RelayMaxPerKey overrides MaxPerKey (integer).
	RelayMaxPerKey = "SLUICE_RELAY_MAX_PER_KEY"
	// RelayPublishConcurrency overrides PublishConcurrency (integer).
	RelayPublishConcurrency = "SLUICE_RELAY_PUBLISH_CONCURRENCY"
	// RelayPipelines overrides Pipelines (integer).
	RelayPipelines = "SLUICE_RELAY_PIPELINES"
	// RelayMaxAttempts overrides MaxAttempts (integer).
	RelayMaxAttempts = "SLUICE_RELAY_MAX_ATTEMPTS"
	// RelayMaxRoundBytes overrides MaxRoundBytes (integer bytes). In Lambda it defaults to the
	// function's memory (AWS_LAMBDA_FUNCTION_MEMORY_SIZE) divided by 8 × Pipelines, so that
	// every round's payloads and their copies in flight fit the function.
	RelayMaxRoundBytes = "SLUICE_RELAY_MAX_ROUND_BYTES"
	// RelayBackoffMax overrides BackoffMax (Go duration).
	RelayBackoffMax = "SLUICE_RELAY_BACKOFF_MAX"
	// RelayOutageLimit overrides OutageLimit (Go duration).
	RelayOutageLimit = "SLUICE_RELAY_OUTAGE_LIMIT"
	// RelayPollInterval overrides PollInterval (Go duration).
	RelayPollInterval = "SLUICE_RELAY_POLL_INTERVAL"
	// RelayRescanInterval overrides RescanInterval (Go duration).
	RelayRescanInterval = "SLUICE_RELAY_RESCAN_INTERVAL"
	// SNSMaxMessageBytes overrides MessageLimits.SNS (integer bytes): the topics'
	// MaximumMessageSize. Defaults to outbox.DefaultSNSMaxMessageBytes (262,144).
	SNSMaxMessageBytes = "SLUICE_SNS_MAX_MESSAGE_BYTES"
	// SQSMaxMessageBytes overrides MessageLimits.SQS (integer bytes): the consumer queues'
	// MaximumMessageSize, which bounds SNS and EventBridge deliveries. Defaults to
	// outbox.DefaultSQSMaxMessageBytes (262,144).
	SQSMaxMessageBytes = "SLUICE_SQS_MAX_MESSAGE_BYTES"
	// EventBridgeMaxEntryBytes overrides MessageLimits.EventBridge (integer bytes): the
	// largest PutEvents entry. Defaults to outbox.DefaultEventBridgeMaxEntryBytes (262,143).
	EventBridgeMaxEntryBytes = "SLUICE_EVENTBRIDGE_MAX_ENTRY_BYTES"
	// KinesisMaxRecordBytes overrides MessageLimits.Kinesis (integer bytes): the streams'
	// maximum record size. Defaults to outbox.DefaultKinesisMaxRecordBytes (1,048,576).
	KinesisMaxRecordBytes = "SLUICE_KINESIS_MAX_RECORD_BYTES"
	// LambdaMemorySize is set by Lambda: the function's memory in MB.
	LambdaMemorySize = "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"
)

// DefaultRelayStopBefore is SLUICE_RELAY_STOP_BEFORE's default.
const DefaultRelayStopBefore = 5 * time.Second

// relayInts and relayDurations are the relay's settings, in outbox.RelayConfig's field order.
func relaySettings(cfg *outbox.RelayConfig) (ints []intSetting, durations []durationSetting) {
	ints = []intSetting{
		{RelayBatchSize, "BatchSize", &cfg.BatchSize},
		{RelayMaxPerKey, "MaxPerKey", &cfg.MaxPerKey},
		{RelayPublishConcurrency, "PublishConcurrency", &cfg.PublishConcurrency},
		{RelayPipelines, "Pipelines", &cfg.Pipelines},
		{RelayMaxRoundBytes, "MaxRoundBytes", &cfg.MaxRoundBytes},
		{RelayMaxAttempts, "MaxAttempts", &cfg.MaxAttempts},
		{SNSMaxMessageBytes, "MessageLimits.SNS", &cfg.MessageLimits.SNS},
		{SQSMaxMessageBytes, "MessageLimits.SQS", &cfg.MessageLimits.SQS},
		{EventBridgeMaxEntryBytes, "MessageLimits.EventBridge", &cfg.MessageLimits.EventBridge},
		{KinesisMaxRecordBytes, "MessageLimits.Kinesis", &cfg.MessageLimits.Kinesis},
		{KafkaMaxMessageBytes, "MessageLimits.Kafka", &cfg.MessageLimits.Kafka},
	}
	durations = []durationSetting{
		{RelayPublishTimeout, "PublishTimeout", &cfg.PublishTimeout},
		{RelayLease, "Lease", &cfg.Lease},
		{RelayBackoffBase, "BackoffBase", &cfg.BackoffBase},
		{RelayBackoffMax, "BackoffMax", &cfg.BackoffMax},
		{RelayOutageLimit, "OutageLimit", &cfg.OutageLimit},
		{RelayPollInterval, "PollInterval", &cfg.PollInterval},
		{RelayRescanInterval, "RescanInterval", &cfg.RescanInterval},
	}
	return ints, durations
}

type intSetting struct {
	env, field string
	v          *int
}

type durationSetting struct {
	env, field string
	v          *time.Duration
}

// RelayEnv lists every variable RelayConfig reads, for help texts.
func RelayEnv() []string {
	var cfg outbox.RelayConfig
	ints, durations := relaySettings(&cfg)
	out := []string{TopicARNs, DefaultTopicARN}
	for _, s := range ints {
		out = append(out, s.env)
	}
	for _, s := range durations {
		out = append(out, s.env)
	}
	return out
}

// RelayConfig builds the relay's configuration from the environment (without Publisher,
// Metrics and Logger, which need clients): the topics (Topics) and the settings
// (RelaySettings). The relay Lambda and `sluice relay` both read it, so they cannot differ.
func RelayConfig(getenv Getenv) (outbox.RelayConfig, error) {
	topics, def, topicErr := Topics(getenv)
	cfg, err := RelaySettings(getenv)
	if err := errors.Join(topicErr, err); err != nil {
		return outbox.RelayConfig{}, err
	}
	cfg.Topics, cfg.DefaultTopic = topics, def
	return cfg, nil
}

// RelaySettings reads every relay setting above (not the topics), checked against outbox's
// bounds. Every problem is reported at once, each naming its variable.
func RelaySettings(getenv Getenv) (outbox.RelayConfig, error) {
	var (
		cfg  outbox.RelayConfig
		errs []error
	)
	ints, durations := relaySettings(&cfg)
	for _, s := range ints {
		raw := getenv(s.env)
		if raw == "" {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s must be an integer, got %q", s.env, raw))
			continue
		}
		*s.v = int(n)
	}
	for _, s := range durations {
		raw := getenv(s.env)
		if raw == "" {
			continue
		}
		d, err := time.ParseDuration(strings.TrimSpace(raw))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s must be a Go duration such as 5s, got %q", s.env, raw))
			continue
		}
		*s.v = d
	}
	if cfg.MaxRoundBytes == 0 {
		if mb, err := strconv.Atoi(getenv(LambdaMemorySize)); err == nil && mb > 0 {
			pipelines := cfg.Pipelines
			if pipelines == 0 {
				pipelines = outbox.DefaultPipelines
			}
			cfg.MaxRoundBytes = max(mb<<20/(8*pipelines), 1<<20)
		}
	}
	if len(errs) == 0 {
		errs = append(errs, nameVariables(cfg.CheckSettings(), ints, durations)...)
	}
	if err := errors.Join(errs...); err != nil {
		return outbox.RelayConfig{}, fmt.Errorf("relay settings: %w", err)
	}
	return cfg, nil
}

// nameVariables turns outbox's field errors ("BatchSize must be ...") into errors naming the
// environment variable that set the field.
func nameVariables(err error, ints []intSetting, durations []durationSetting) []error {
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
	for _, s := range ints {
		envOf[s.field] = s.env
	}
	for _, s := range durations {
		envOf[s.field] = s.env
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		field, _, _ := strings.Cut(e.Error(), " ")
		if env, ok := envOf[field]; ok {
			e = fmt.Errorf("%s: %w", env, e)
		}
		out = append(out, e)
	}
	return out
}
