package lambdaenv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/inbox"
)

// Consumer settings beyond ConsumerName and ConsumerCommitMode (lambdaenv.go). Each sets the
// inbox.ConsumerConfig field of the same name.
const (
	// ConsumerDeadlineMargin overrides DeadlineMargin (Go duration): a record is not started when
	// the invocation's deadline is nearer. A negative value disables the check. Defaults to
	// DefaultConsumerDeadlineMargin.
	ConsumerDeadlineMargin = "SLUICE_CONSUMER_DEADLINE_MARGIN"
	// ConsumerStorePayload sets StorePayload ("true" or "false"): keep each message's payload
	// and headers in inbox_event for audit or replay. Defaults to DefaultConsumerStorePayload.
	ConsumerStorePayload = "SLUICE_CONSUMER_STORE_PAYLOAD"
	// ConsumerMaxReceiveCount sets SQSMaxReceiveCount (a positive integer): the SQS queue's
	// maxReceiveCount, so that a record's failure on its last receive marks its dead letter
	// dead. The CDK construct sets it from the queue it builds. Defaults to
	// DefaultConsumerMaxReceiveCount.
	ConsumerMaxReceiveCount = "SLUICE_CONSUMER_MAX_RECEIVE_COUNT"
	// ConsumerStreamMaxAttempts sets StreamMaxAttempts (a positive integer): a Kinesis or Kafka
	// event source mapping's MaximumRetryAttempts + 1, the deliveries of a failing record before
	// the mapping gives up (consumers of an SNS topic or an EventBridge bus read a queue:
	// ConsumerMaxReceiveCount). The CDK construct sets it from the mapping it builds. Defaults to
	// DefaultConsumerStreamMaxAttempts.
	ConsumerStreamMaxAttempts = "SLUICE_CONSUMER_STREAM_MAX_ATTEMPTS"
)

// Consumer defaults, quoted by help texts and the CDK props.
const (
	// DefaultConsumerCommitMode is SLUICE_CONSUMER_COMMIT_MODE's default.
	DefaultConsumerCommitMode = inbox.PerRecord
	// DefaultConsumerDeadlineMargin is SLUICE_CONSUMER_DEADLINE_MARGIN's default.
	DefaultConsumerDeadlineMargin = inbox.DefaultDeadlineMargin
	// DefaultConsumerStorePayload is SLUICE_CONSUMER_STORE_PAYLOAD's default.
	DefaultConsumerStorePayload = false
	// DefaultConsumerMaxReceiveCount is SLUICE_CONSUMER_MAX_RECEIVE_COUNT's default.
	DefaultConsumerMaxReceiveCount = inbox.DefaultSQSMaxReceiveCount
	// DefaultConsumerStreamMaxAttempts is SLUICE_CONSUMER_STREAM_MAX_ATTEMPTS's default.
	DefaultConsumerStreamMaxAttempts = inbox.DefaultStreamMaxAttempts
)

// ProcessorMaxAttempts is the inbox processor's attempts before it parks a row (an async
// consumer's stored message or a retried dead letter; inbox.ProcessorConfig.MaxAttempts).
// Defaults to inbox.DefaultMaxAttempts.
const ProcessorMaxAttempts = "SLUICE_PROCESSOR_MAX_ATTEMPTS"

// ConsumerConfig builds a consumer Lambda's inbox configuration from the environment (without
// Router, Logger and Metrics, which are code): the consumer name (required), the commit mode,
// the deadline margin, whether payloads are stored and its source's attempts (which mark a
// dead letter dead). Every consumer Lambda reads it, so they
// cannot differ; the CDK constructs validate their props with it. Every problem is reported at
// once, each naming its variable. In the async mode the Lambda only stores each message; in
// every mode the same function applies the stored rows (the async mode's, retried dead letters)
// when its schedule invokes it (ProcessorConfig).
func ConsumerConfig(getenv Getenv) (inbox.ConsumerConfig, error) {
	cfg := inbox.ConsumerConfig{
		Mode:               DefaultConsumerCommitMode,
		DeadlineMargin:     DefaultConsumerDeadlineMargin,
		StorePayload:       DefaultConsumerStorePayload,
		SQSMaxReceiveCount: DefaultConsumerMaxReceiveCount,
		StreamMaxAttempts:  DefaultConsumerStreamMaxAttempts,
	}
	var errs []error
	cfg.Consumer = strings.TrimSpace(getenv(ConsumerName))
	if cfg.Consumer == "" {
		errs = append(errs, fmt.Errorf("%s is required: the inbox consumer name, the first half of the inbox key (keep it stable)", ConsumerName))
	}
	if raw := getenv(ConsumerCommitMode); raw != "" {
		mode, err := inbox.ParseMode(raw)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s must be per-record, batched or async, got %q", ConsumerCommitMode, raw))
		default:
			cfg.Mode = mode
		}
	}
	if raw := getenv(ConsumerDeadlineMargin); raw != "" {
		d, err := time.ParseDuration(strings.TrimSpace(raw))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s must be a Go duration such as 3s, got %q", ConsumerDeadlineMargin, raw))
		case d > 15*time.Minute:
			errs = append(errs, fmt.Errorf("%s must be at most 15m (the longest Lambda timeout), got %s", ConsumerDeadlineMargin, d))
		case d != 0:
			cfg.DeadlineMargin = d
		}
	}
	if raw := getenv(ConsumerStorePayload); raw != "" {
		b, err := strconv.ParseBool(strings.TrimSpace(raw))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s must be true or false, got %q", ConsumerStorePayload, raw))
		}
		cfg.StorePayload = b
	}
	for _, v := range []struct {
		name, what string
		dst        *int
	}{
		{ConsumerMaxReceiveCount, "the SQS queue's maxReceiveCount", &cfg.SQSMaxReceiveCount},
		{ConsumerStreamMaxAttempts, "the stream mapping's MaximumRetryAttempts + 1", &cfg.StreamMaxAttempts},
	} {
		if raw := getenv(v.name); raw != "" {
			n, err := strconv.Atoi(strings.TrimSpace(raw))
			if err != nil || n < 1 {
				errs = append(errs, fmt.Errorf("%s must be a positive integer (%s), got %q", v.name, v.what, raw))
				continue
			}
			*v.dst = n
		}
	}
	if err := errors.Join(errs...); err != nil {
		return inbox.ConsumerConfig{}, fmt.Errorf("consumer settings: %w", err)
	}
	return cfg, nil
}

// ProcessorConfig builds the inbox processor's configuration from the environment
// (without Router, Logger and Metrics, which are code): the consumer whose stored rows it
// applies (SLUICE_CONSUMER_NAME, required) and its attempts before parking a row
// (SLUICE_PROCESSOR_MAX_ATTEMPTS). The consumer Lambda (its scheduled invocations, in every
// commit mode) and examples/processor both read it.
func ProcessorConfig(getenv Getenv) (inbox.ProcessorConfig, error) {
	var cfg inbox.ProcessorConfig
	var errs []error
	cfg.Consumer = strings.TrimSpace(getenv(ConsumerName))
	if cfg.Consumer == "" {
		errs = append(errs, fmt.Errorf("%s is required: the consumer whose stored rows the processor applies", ConsumerName))
	}
	if raw := getenv(ProcessorMaxAttempts); raw != "" {
		n, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil || n < 1 || n > 1000 {
			errs = append(errs, fmt.Errorf("%s must be an integer between 1 and 1000, got %q", ProcessorMaxAttempts, raw))
		}
		cfg.MaxAttempts = n
	}
	if err := errors.Join(errs...); err != nil {
		return inbox.ProcessorConfig{}, fmt.Errorf("processor settings: %w", err)
	}
	return cfg, nil
}
