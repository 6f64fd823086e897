package outbox

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A Setting is one tunable number of the relay, declared once in RelaySettings with everything
// that is said about it elsewhere: the RelayConfig field it sets, the environment variable the
// relay Lambda and `sluice relay` read it from (pkg/lambdaenv), the `sluice relay` flag, its
// default and bounds, and what it does. RelayConfig.WithDefaults and CheckSettings apply the
// defaults and bounds; pkg/lambdaenv reads the variables; the CLI builds its help and flags;
// infra.RelaySettings and the table in docs/outbox.md are checked against it by tests.
type Setting struct {
	// Field is the RelayConfig field, with its struct's name for a nested one
	// ("BatchSize", "ClaimCheck.MaxPayloadBytes").
	Field string
	// Env is the environment variable that sets it, a contract with deployed stacks: never
	// rename one. "" when it is set in code only.
	Env string
	// Flag is the `sluice relay` flag that overrides Env, without dashes; "" for none.
	Flag string
	// Unit is how values are written: "count" and "bytes" as decimal integers, "duration" as a
	// Go duration (time.ParseDuration); the value is the field's int, or its time.Duration in
	// nanoseconds.
	Unit string
	// Default is what a zero field becomes. 0 means the zero value has a meaning of its own,
	// which Doc states, and is not checked against Min and Max.
	Default int64
	// Min and Max bound the value (after defaults), both included.
	Min, Max int64
	// Doc says what the setting does, in one sentence, for help texts and docs/outbox.md.
	Doc string
	// Source cites where a default that is a service's limit comes from.
	Source string

	// ref returns a pointer to the field in c (*int or *time.Duration), allocating
	// c.ClaimCheck when alloc is set; nil when the field is in a nil ClaimCheck.
	ref func(c *RelayConfig, alloc bool) any
}

// relaySettings is RelaySettings' table.
var relaySettings = []Setting{
	{Field: "BatchSize", Env: "SLUICE_RELAY_BATCH_SIZE", Flag: "batch-size", Unit: "count", Default: 500, Min: 1, Max: 10_000,
		// The bounds of BatchSize, MaxPerKey, PublishConcurrency and Pipelines: more makes rounds
		// hold more keys (PostgreSQL lock-table entries) and memory than any measured gain.
		Doc: "the most rows one round takes, and the most partition keys it holds",
		ref: func(c *RelayConfig, _ bool) any { return &c.BatchSize }},
	{Field: "MaxPerKey", Env: "SLUICE_RELAY_MAX_PER_KEY", Unit: "count", Default: 10, Min: 1, Max: 1000,
		Doc: "the most rows of one partition key a round takes; a key's rows go out one after another, so less spreads a round over more keys",
		ref: func(c *RelayConfig, _ bool) any { return &c.MaxPerKey }},
	{Field: "PublishConcurrency", Env: "SLUICE_RELAY_PUBLISH_CONCURRENCY", Unit: "count", Default: 64, Min: 1, Max: 1024,
		Doc: "PublishBatch calls in flight, across pipelines",
		ref: func(c *RelayConfig, _ bool) any { return &c.PublishConcurrency }},
	{Field: "Pipelines", Env: "SLUICE_RELAY_PIPELINES", Unit: "count", Default: 2, Min: 1, Max: 16,
		Doc: "claim-publish-record rounds run at once, so that one round's database work overlaps another's publishing",
		ref: func(c *RelayConfig, _ bool) any { return &c.Pipelines }},
	{Field: "MaxRoundBytes", Env: "SLUICE_RELAY_MAX_ROUND_BYTES", Unit: "bytes", Default: 16 << 20, Min: 64 << 10, Max: 1 << 30,
		Doc: "payload bytes one round holds in memory (the relay Lambda's default: its memory ÷ (8 × Pipelines), at least 1 MiB)",
		ref: func(c *RelayConfig, _ bool) any { return &c.MaxRoundBytes }},
	{Field: "MessageLimits.SNS", Env: "SLUICE_SNS_MAX_MESSAGE_BYTES", Unit: "bytes", Default: 262_144, Min: minMessageLimitBytes, Max: 1_048_576,
		Doc:    "the SNS topics' MaximumMessageSize: body and attributes together",
		Source: "Amazon SNS Developer Guide, Publishing large messages (https://docs.aws.amazon.com/sns/latest/dg/large-message-payloads.html): 1,024 to 1,048,576, 262,144 by default",
		ref:    func(c *RelayConfig, _ bool) any { return &c.MessageLimits.SNS }},
	{Field: "MessageLimits.SQS", Env: "SLUICE_SQS_MAX_MESSAGE_BYTES", Unit: "bytes", Default: 262_144, Min: minMessageLimitBytes, Max: 1_048_576,
		Doc:    "the consumer queues' MaximumMessageSize, which bounds what SNS and EventBridge deliver to them",
		Source: "Amazon SQS Developer Guide, Amazon SQS message quotas (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html): MaximumMessageSize 1,024 to 1,048,576, 262,144 by default",
		ref:    func(c *RelayConfig, _ bool) any { return &c.MessageLimits.SQS }},
	{Field: "MessageLimits.EventBridge", Env: "SLUICE_EVENTBRIDGE_MAX_ENTRY_BYTES", Unit: "bytes", Default: 262_144 - 1, Min: minMessageLimitBytes, Max: 262_144 - 1,
		Doc:    "the largest PutEvents entry: Time's 14 bytes, Source, DetailType and Detail",
		Source: `Amazon EventBridge User Guide, Calculating PutEvents event entry size (https://docs.aws.amazon.com/eventbridge/latest/userguide/calculate-putevents-entry-size.html): "less than 256KB"`,
		ref:    func(c *RelayConfig, _ bool) any { return &c.MessageLimits.EventBridge }},
	{Field: "MessageLimits.Kinesis", Env: "SLUICE_KINESIS_MAX_RECORD_BYTES", Unit: "bytes", Default: 1 << 20, Min: 1 << 20, Max: 10 << 20,
		Doc:    "the streams' maximum record size: data and partition key",
		Source: "Amazon Kinesis Data Streams API Reference, UpdateMaxRecordSize (https://docs.aws.amazon.com/kinesis/latest/APIReference/API_UpdateMaxRecordSize.html): 1 MiB by default, up to 10 MiB",
		ref:    func(c *RelayConfig, _ bool) any { return &c.MessageLimits.Kinesis }},
	{Field: "MessageLimits.Kafka", Env: "SLUICE_KAFKA_MAX_MESSAGE_BYTES", Unit: "bytes", Default: 1_000_000, Min: minMessageLimitBytes, Max: 100 << 20,
		Doc:    "the largest record batch the brokers take (message.max.bytes), also the producer's ProducerBatchMaxBytes",
		Source: "Kafka broker config message.max.bytes (1,048,588 by default) less headroom; at most franz-go's BrokerMaxWriteBytes (100 MiB)",
		ref:    func(c *RelayConfig, _ bool) any { return &c.MessageLimits.Kafka }},
	{Field: "MaxMessageBytes", Unit: "bytes", Min: 1024, Max: 64 << 20,
		Doc: "caps every destination's message limit; 0 (the default) is each destination's own",
		ref: func(c *RelayConfig, _ bool) any { return &c.MaxMessageBytes }},
	{Field: "ClaimCheck.Threshold", Env: "SLUICE_CLAIM_CHECK_THRESHOLD", Unit: "bytes", Min: 1024, Max: 100 << 20,
		Doc: "the message size above which the claim check stores the payload in S3; 0 (the default) is each destination's limit",
		ref: claimCheckRef(func(cc *ClaimCheck) *int { return &cc.Threshold })},
	{Field: "ClaimCheck.MaxPayloadBytes", Env: "SLUICE_CLAIM_CHECK_MAX_PAYLOAD", Unit: "bytes", Default: 32 << 20, Min: 1, Max: 256 << 20,
		Doc: "the largest payload the claim check stores in S3 (the relay reads a payload whole); a larger row is quarantined",
		ref: claimCheckRef(func(cc *ClaimCheck) *int { return &cc.MaxPayloadBytes })},
	{Field: "PublishTimeout", Env: "SLUICE_RELAY_PUBLISH_TIMEOUT", Unit: "duration", Default: int64(10 * time.Second), Min: int64(time.Millisecond), Max: int64(15 * time.Minute),
		Doc: "bounds one PublishBatch call; shorter than Lease",
		ref: func(c *RelayConfig, _ bool) any { return &c.PublishTimeout }},
	{Field: "SlowCall", Env: "SLUICE_RELAY_SLOW_CALL", Unit: "duration", Default: int64(250 * time.Millisecond), Min: int64(time.Millisecond), Max: int64(15 * time.Minute),
		Doc: "a call in flight longer than this (or PublishTimeout, if shorter) makes its destination slow: ordinary rounds send it nothing more until that call ends, and the call no longer holds a pipeline or a PublishConcurrency slot; unused by a relay with one destination (docs/outbox.md, \"Liveness\")",
		ref: func(c *RelayConfig, _ bool) any { return &c.SlowCall }},
	{Field: "Lease", Env: "SLUICE_RELAY_LEASE", Unit: "duration", Default: int64(30 * time.Second), Min: int64(100 * time.Millisecond), Max: int64(time.Hour),
		Doc: "the most a round may hold its keys: publishing stops at ¾ of it, each statement at ½, and PostgreSQL ends a round's session idle longer",
		ref: func(c *RelayConfig, _ bool) any { return &c.Lease }},
	{Field: "MaxAttempts", Env: "SLUICE_RELAY_MAX_ATTEMPTS", Unit: "count", Default: 10, Min: 1, Max: 1000,
		Doc: "failed attempts of a row (while its destination works) before it is quarantined",
		ref: func(c *RelayConfig, _ bool) any { return &c.MaxAttempts }},
	{Field: "BackoffBase", Env: "SLUICE_RELAY_BACKOFF_BASE", Unit: "duration", Default: int64(time.Second), Min: int64(time.Millisecond), Max: int64(24 * time.Hour),
		Doc: "the first backoff of a row's attempts and of a failing destination's probes",
		ref: func(c *RelayConfig, _ bool) any { return &c.BackoffBase }},
	{Field: "BackoffMax", Env: "SLUICE_RELAY_BACKOFF_MAX", Unit: "duration", Default: int64(5 * time.Minute), Min: int64(time.Millisecond), Max: int64(24 * time.Hour),
		Doc: "the longest backoff, not below BackoffBase",
		ref: func(c *RelayConfig, _ bool) any { return &c.BackoffMax }},
	{Field: "OutageLimit", Env: "SLUICE_RELAY_OUTAGE_LIMIT", Unit: "duration", Default: int64(24 * time.Hour), Min: int64(time.Second), Max: int64(365 * 24 * time.Hour),
		Doc: "how long a row may fail because its whole destination fails before it is quarantined all the same",
		ref: func(c *RelayConfig, _ bool) any { return &c.OutageLimit }},
	{Field: "PollInterval", Env: "SLUICE_RELAY_POLL_INTERVAL", Unit: "duration", Default: int64(50 * time.Millisecond), Min: int64(time.Millisecond), Max: int64(time.Hour),
		Doc: "how often Run looks for newly committed rows (one primary-key lookup)",
		ref: func(c *RelayConfig, _ bool) any { return &c.PollInterval }},
	{Field: "RescanInterval", Env: "SLUICE_RELAY_RESCAN_INTERVAL", Unit: "duration", Default: int64(time.Second), Min: int64(time.Millisecond), Max: int64(24 * time.Hour),
		Doc: "how often Run walks every pending partition key (spaced out further when a walk takes long)",
		ref: func(c *RelayConfig, _ bool) any { return &c.RescanInterval }},
	{Field: "IdleStop", Env: "SLUICE_RELAY_IDLE_STOP", Flag: "idle-stop", Unit: "duration", Min: int64(time.Millisecond), Max: int64(time.Hour),
		Doc: "Run returns once it claimed nothing for this long and no round is in flight, for relays a schedule starts again; 0 (the default) polls until stopped",
		ref: func(c *RelayConfig, _ bool) any { return &c.IdleStop }},
	{Field: "MetricsInterval", Unit: "duration", Default: int64(30 * time.Second), Min: int64(time.Millisecond), Max: int64(24 * time.Hour),
		Doc: "how often Run emits the heartbeat and lag metrics",
		ref: func(c *RelayConfig, _ bool) any { return &c.MetricsInterval }},
}

// RelaySettings returns the declaration of every tunable number of RelayConfig (and of its
// MessageLimits and ClaimCheck), in field order, the order errors are reported in. It is a
// copy: changing it changes nothing.
//
// To add a relay setting: add its field to RelayConfig (its doc comment saying "Defaults to
// X." with X as Format writes the default), add one entry to relaySettings above, and run the
// tests; they tell you what else is missing (docs/outbox.md, "Adding a relay setting"):
// TestSettingsDocs regenerates the table in docs/outbox.md (go test ./pkg/outbox -run
// TestSettingsDocs -update-docs), the infra tests ask for a field of infra.RelaySettings (or
// the construct that sets it), pkg/lambdaenv lists the variable names it must keep, and reads
// the new variable with no change; `sluice relay` lists it in its help.
func RelaySettings() []Setting { return slices.Clone(relaySettings) }

func claimCheckRef(field func(*ClaimCheck) *int) func(*RelayConfig, bool) any {
	return func(c *RelayConfig, alloc bool) any {
		if c.ClaimCheck == nil {
			if !alloc {
				return nil
			}
			c.ClaimCheck = &ClaimCheck{}
		}
		return field(c.ClaimCheck)
	}
}

// settingIndex finds RelaySettings' entries by Field.
var settingIndex = func() map[string]int {
	m := make(map[string]int, len(relaySettings))
	for i, s := range relaySettings {
		m[s.Field] = i
	}
	return m
}()

// RelaySetting returns the entry of RelaySettings for field ("BatchSize",
// "ClaimCheck.Threshold"). It panics on a field that is not a setting: a bug in the caller.
func RelaySetting(field string) Setting {
	i, ok := settingIndex[field]
	if !ok {
		panic("outbox: no relay setting " + field)
	}
	return relaySettings[i]
}

// settingDefault returns a field's declared default as an int, for the package's own use.
func settingDefault(field string) int { return int(RelaySetting(field).Default) }

// Get returns the setting's value in c (0 when it is a ClaimCheck field and c has none).
func (s Setting) Get(c RelayConfig) int64 {
	switch p := s.ref(&c, false).(type) {
	case *int:
		return int64(*p)
	case *time.Duration:
		return int64(*p)
	}
	return 0
}

// Set sets the setting's field in c to v, giving c a ClaimCheck for a ClaimCheck field.
func (s Setting) Set(c *RelayConfig, v int64) {
	switch p := s.ref(c, true).(type) {
	case *int:
		*p = int(v)
	case *time.Duration:
		*p = time.Duration(v)
	}
}

// Parse reads a value as Env and Flag are written (see Unit). Its error reads after the
// variable's or flag's name: "must be an integer, got ...".
func (s Setting) Parse(text string) (int64, error) {
	text = strings.TrimSpace(text)
	if s.Unit == "duration" {
		d, err := time.ParseDuration(text)
		if err != nil {
			return 0, fmt.Errorf("must be a Go duration such as 5s, got %q", text)
		}
		return int64(d), nil
	}
	n, err := strconv.ParseInt(text, 10, 0)
	if err != nil {
		return 0, fmt.Errorf("must be an integer, got %q", text)
	}
	return n, nil
}

// Text writes v as Parse reads it: the value of Env.
func (s Setting) Text(v int64) string {
	if s.Unit == "duration" {
		return time.Duration(v).String()
	}
	return strconv.FormatInt(v, 10)
}

// Format writes v for people: 1,000 (count), 16 MiB or 262,143 bytes (bytes), 5m (duration).
func (s Setting) Format(v int64) string {
	switch s.Unit {
	case "duration":
		t := time.Duration(v).String()
		if strings.HasSuffix(t, "m0s") {
			t = strings.TrimSuffix(t, "0s")
		}
		if strings.HasSuffix(t, "h0m") {
			t = strings.TrimSuffix(t, "0m")
		}
		return t
	case "bytes":
		for _, u := range []struct {
			shift int
			name  string
		}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
			if v >= 1<<u.shift && v%(1<<u.shift) == 0 {
				return fmt.Sprintf("%d %s", v>>u.shift, u.name)
			}
		}
		if v == 1 {
			return "1 byte"
		}
		return thousands(v) + " bytes"
	}
	return thousands(v)
}

// Check reports v out of the setting's bounds, naming the field; nil when it is in them, or when
// v is 0 and the zero value has a meaning of its own (Default 0).
func (s Setting) Check(v int64) error {
	if (v == 0 && s.Default == 0) || (v >= s.Min && v <= s.Max) {
		return nil
	}
	zero := ""
	if s.Default == 0 {
		zero = "0 (the default) or "
	}
	return fmt.Errorf("%s must be %sbetween %s and %s, got %s", s.Field, zero, s.Text(s.Min), s.Text(s.Max), s.Text(v))
}

// thousands writes n with a comma between each group of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}
