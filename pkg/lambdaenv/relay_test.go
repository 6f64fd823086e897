package lambdaenv

import (
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// aValue is a value of s inside its bounds and other than its default.
func aValue(s outbox.Setting) int64 {
	switch s.Default {
	case 0: // the zero value means something of its own
		return s.Min
	case s.Min:
		return s.Max
	}
	return s.Min + (s.Default-s.Min)/2
}

// Every entry of outbox.RelaySettings that has a variable is read by RelaySettings (or, for the
// claim check's, by ClaimCheck): a setting added to the table needs no change here. What a
// deployment tool writes with Setting.Text is what the relay reads back.
func TestRelaySettingsReadsEveryDeclaredVariable(t *testing.T) {
	t.Parallel()
	vars := map[string]string{ClaimCheckBucket: "payloads"}
	want := outbox.RelayConfig{}
	for _, s := range outbox.RelaySettings() {
		if s.Env == "" {
			continue
		}
		require.True(t, strings.HasPrefix(s.Env, "SLUICE_"), s.Env)
		v := aValue(s)
		require.NotEqual(t, s.Default, v, s.Field)
		require.NoError(t, s.Check(v), s.Field)
		vars[s.Env] = s.Text(v)
		s.Set(&want, v)
	}
	cfg, err := RelaySettings(env(vars))
	require.NoError(t, err)
	cc, err := ClaimCheck(env(vars), aws.Config{})
	require.NoError(t, err)
	cfg.ClaimCheck = cc
	for _, s := range outbox.RelaySettings() {
		require.Equal(t, s.Get(want), s.Get(cfg), "%s (%s)", s.Field, s.Env)
	}

	cfg, err = RelaySettings(env(nil))
	require.NoError(t, err)
	require.Equal(t, outbox.RelayConfig{}, cfg, "unset: outbox's defaults apply")
}

// The claim check's variables are also named in this package, for the consumers and `sluice
// status`: the same names as the table's.
func TestClaimCheckVariablesAreTheTables(t *testing.T) {
	t.Parallel()
	require.Equal(t, ClaimCheckThreshold, outbox.RelaySetting("ClaimCheck.Threshold").Env)
	require.Equal(t, ClaimCheckMaxPayload, outbox.RelaySetting("ClaimCheck.MaxPayloadBytes").Env)
	threshold, err := ClaimCheckThresholdOf(env(map[string]string{ClaimCheckThreshold: "204800"}))
	require.NoError(t, err)
	require.Equal(t, 204800, threshold)
	_, err = ClaimCheckThresholdOf(env(map[string]string{ClaimCheckThreshold: "100"}))
	require.ErrorContains(t, err, ClaimCheckThreshold+": ClaimCheck.Threshold must be 0 (the default) or between 1024")
	_, err = ClaimCheck(env(map[string]string{ClaimCheckBucket: "b", ClaimCheckMaxPayload: "-1", ClaimCheckThreshold: "x"}), aws.Config{})
	require.ErrorContains(t, err, ClaimCheckThreshold+" must be an integer")
	_, err = ClaimCheck(env(map[string]string{ClaimCheckBucket: "b", ClaimCheckMaxPayload: "-1"}), aws.Config{})
	require.ErrorContains(t, err, ClaimCheckMaxPayload+": ClaimCheck.MaxPayloadBytes must be between 1 and")
}

// The variables are a contract with deployed stacks (issue 26): their names do not change.
func TestRelayVariablesKeepTheirNames(t *testing.T) {
	t.Parallel()
	var got []string
	for _, s := range outbox.RelaySettings() {
		if s.Env != "" {
			got = append(got, s.Env)
		}
	}
	require.Equal(t, []string{"SLUICE_RELAY_BATCH_SIZE", "SLUICE_RELAY_MAX_PER_KEY", "SLUICE_RELAY_PUBLISH_CONCURRENCY",
		"SLUICE_RELAY_PIPELINES", "SLUICE_RELAY_MAX_ROUND_BYTES", "SLUICE_SNS_MAX_MESSAGE_BYTES", "SLUICE_SQS_MAX_MESSAGE_BYTES",
		"SLUICE_EVENTBRIDGE_MAX_ENTRY_BYTES", "SLUICE_KINESIS_MAX_RECORD_BYTES", "SLUICE_KAFKA_MAX_MESSAGE_BYTES",
		"SLUICE_CLAIM_CHECK_THRESHOLD", "SLUICE_CLAIM_CHECK_MAX_PAYLOAD", "SLUICE_RELAY_PUBLISH_TIMEOUT", "SLUICE_RELAY_SLOW_CALL", "SLUICE_RELAY_LEASE",
		"SLUICE_RELAY_MAX_ATTEMPTS", "SLUICE_RELAY_BACKOFF_BASE", "SLUICE_RELAY_BACKOFF_MAX", "SLUICE_RELAY_OUTAGE_LIMIT",
		"SLUICE_RELAY_POLL_INTERVAL", "SLUICE_RELAY_RESCAN_INTERVAL", "SLUICE_RELAY_IDLE_STOP"}, got, "a new variable is added; none is renamed")
}

func TestRelayConfigNamesTheVariableOfEachProblem(t *testing.T) {
	t.Parallel()
	_, err := RelayConfig(env(map[string]string{
		DefaultTopicARN: "arn:d", "SLUICE_RELAY_BATCH_SIZE": "9223372036854775807", "SLUICE_RELAY_PIPELINES": "0x2",
		"SLUICE_RELAY_POLL_INTERVAL": "-1s", "SLUICE_RELAY_LEASE": "soon",
	}))
	require.Error(t, err)
	msg := err.Error()
	require.Contains(t, msg, "SLUICE_RELAY_PIPELINES must be an integer")
	require.Contains(t, msg, "SLUICE_RELAY_LEASE must be a Go duration")
	_, err = RelayConfig(env(map[string]string{DefaultTopicARN: "arn:d", "SLUICE_RELAY_BATCH_SIZE": "9223372036854775807", "SLUICE_RELAY_POLL_INTERVAL": "-1s"}))
	require.ErrorContains(t, err, "SLUICE_RELAY_BATCH_SIZE: BatchSize must be between 1 and 10000, got 9223372036854775807")
	require.ErrorContains(t, err, "SLUICE_RELAY_POLL_INTERVAL: PollInterval must be between")
	require.Less(t, strings.Index(err.Error(), "SLUICE_RELAY_BATCH_SIZE"), strings.Index(err.Error(), "SLUICE_RELAY_POLL_INTERVAL"), "stable order")
	_, err = RelayConfig(env(map[string]string{"SLUICE_RELAY_BATCH_SIZE": "7"}))
	require.ErrorContains(t, err, TopicARNs, "the topics are required")
}

func TestRelayRoundBudgetFollowsTheLambdasMemory(t *testing.T) {
	t.Parallel()
	cfg, err := RelayConfig(env(map[string]string{DefaultTopicARN: "arn:d", LambdaMemorySize: "256"}))
	require.NoError(t, err)
	require.Equal(t, 16<<20, cfg.MaxRoundBytes, "256 MB over 8 × 2 pipelines")
	cfg, err = RelayConfig(env(map[string]string{DefaultTopicARN: "arn:d"}))
	require.NoError(t, err)
	require.Zero(t, cfg.MaxRoundBytes, "outside Lambda: the library's default")
}

// SLUICE_RELAY_WAL_PUBLICATION turns the WAL wake-up on with its publication; unset, the relay
// polls.
func TestRelayConfigWALWakeUp(t *testing.T) {
	t.Parallel()
	env := map[string]string{TopicARNs: `{"orders":"arn:aws:sns:us-east-1:000000000000:orders"}`}
	cfg, err := RelayConfig(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Nil(t, cfg.WAL, "polling unless asked")
	env[RelayWALPublication] = "sluice_outbox"
	cfg, err = RelayConfig(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, &outbox.WALWake{Publication: "sluice_outbox"}, cfg.WAL)
}

// In Lambda a relay process's round memory is the function's memory ÷ 8, what one relay's
// rounds get from MaxRoundBytes's default; outside Lambda there is none (the fleet's default).
func TestRoundMemoryIsAnEighthOfTheFunctionsMemory(t *testing.T) {
	t.Parallel()
	m := RoundMemory(func(k string) string {
		if k == LambdaMemorySize {
			return "512"
		}
		return ""
	})
	require.NotNil(t, m)
	require.Equal(t, 64<<20, m.Stats().Limit)
	require.Nil(t, RoundMemory(func(string) string { return "" }))
}
