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
// inbox.Config field of the same name.
const (
	// ConsumerDeadlineMargin overrides DeadlineMargin (Go duration): a record is not started when
	// the invocation's deadline is nearer. A negative value disables the check. Defaults to
	// DefaultConsumerDeadlineMargin.
	ConsumerDeadlineMargin = "SLUICE_CONSUMER_DEADLINE_MARGIN"
	// ConsumerStorePayload sets StorePayload ("true" or "false"): keep each message's payload
	// and headers in inbox_event for audit or replay. Defaults to DefaultConsumerStorePayload.
	ConsumerStorePayload = "SLUICE_CONSUMER_STORE_PAYLOAD"
)

// Consumer defaults, quoted by help texts and the CDK props.
const (
	// DefaultConsumerCommitMode is SLUICE_CONSUMER_COMMIT_MODE's default.
	DefaultConsumerCommitMode = inbox.PerRecord
	// DefaultConsumerDeadlineMargin is SLUICE_CONSUMER_DEADLINE_MARGIN's default.
	DefaultConsumerDeadlineMargin = inbox.DefaultDeadlineMargin
	// DefaultConsumerStorePayload is SLUICE_CONSUMER_STORE_PAYLOAD's default.
	DefaultConsumerStorePayload = false
)

// ErrAsyncWithoutProcessor refuses SLUICE_CONSUMER_COMMIT_MODE=async: in that mode the Lambda
// only stores each message and acknowledges it, and a Processor must apply it later. No
// processor runs beside the consumer Lambda (the CDK constructs refuse async for the same
// reason), so every message would be acknowledged and never applied.
var ErrAsyncWithoutProcessor = errors.New("commit mode async needs an inbox Processor, and none runs beside this Lambda: " +
	"messages would be acknowledged and never applied; use per-record or batched")

// ConsumerConfig builds a consumer Lambda's inbox configuration from the environment (without
// Router, Logger and Metrics, which are code): the consumer name (required), the commit mode,
// the deadline margin and whether payloads are stored. Every consumer Lambda reads it, so they
// cannot differ; the CDK constructs validate their props with it. Every problem is reported at
// once, each naming its variable. The async mode is refused with ErrAsyncWithoutProcessor.
func ConsumerConfig(getenv Getenv) (inbox.Config, error) {
	cfg := inbox.Config{
		Mode:           DefaultConsumerCommitMode,
		DeadlineMargin: DefaultConsumerDeadlineMargin,
		StorePayload:   DefaultConsumerStorePayload,
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
			errs = append(errs, fmt.Errorf("%s must be per-record or batched, got %q", ConsumerCommitMode, raw))
		case mode == inbox.Async:
			errs = append(errs, fmt.Errorf("%s: %w", ConsumerCommitMode, ErrAsyncWithoutProcessor))
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
	if err := errors.Join(errs...); err != nil {
		return inbox.Config{}, fmt.Errorf("consumer settings: %w", err)
	}
	return cfg, nil
}
