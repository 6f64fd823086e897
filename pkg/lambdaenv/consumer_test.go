package lambdaenv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
)

func TestConsumerConfigReadsEverySettingAndDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := ConsumerConfig(env(map[string]string{ConsumerName: "billing"}))
	require.NoError(t, err)
	require.Equal(t, inbox.ConsumerConfig{Consumer: "billing", Mode: DefaultConsumerCommitMode, DeadlineMargin: DefaultConsumerDeadlineMargin,
		StorePayload: DefaultConsumerStorePayload, SQSMaxReceiveCount: DefaultConsumerMaxReceiveCount,
		StreamMaxAttempts: DefaultConsumerStreamMaxAttempts}, cfg)

	cfg, err = ConsumerConfig(env(map[string]string{ConsumerName: " billing ", ConsumerCommitMode: "batched",
		ConsumerDeadlineMargin: "-1s", ConsumerStorePayload: "true", ConsumerMaxReceiveCount: " 3 ",
		ConsumerStreamMaxAttempts: "1"}))
	require.NoError(t, err)
	require.Equal(t, inbox.ConsumerConfig{Consumer: "billing", Mode: inbox.Batched, DeadlineMargin: -time.Second, StorePayload: true,
		SQSMaxReceiveCount: 3, StreamMaxAttempts: 1}, cfg)
}

func TestConsumerConfigNamesEveryProblem(t *testing.T) {
	t.Parallel()
	cfg, err := ConsumerConfig(env(map[string]string{ConsumerName: "billing", ConsumerCommitMode: "async"}))
	require.NoError(t, err, "the async mode deploys: the same function runs the processor on its schedule")
	require.Equal(t, inbox.Async, cfg.Mode)

	_, err = ConsumerConfig(env(map[string]string{ConsumerCommitMode: "eventually", ConsumerDeadlineMargin: "soon",
		ConsumerStorePayload: "maybe", ConsumerMaxReceiveCount: "five", ConsumerStreamMaxAttempts: "0"}))
	require.Error(t, err)
	for _, want := range []string{ConsumerName + " is required", ConsumerCommitMode + " must be per-record, batched or async",
		ConsumerDeadlineMargin + " must be a Go duration", ConsumerStorePayload + " must be true or false",
		ConsumerMaxReceiveCount + ` must be a positive integer (the SQS queue's maxReceiveCount), got "five"`,
		ConsumerStreamMaxAttempts + ` must be a positive integer (the stream mapping's MaximumRetryAttempts + 1), got "0"`} {
		require.ErrorContains(t, err, want)
	}
	for _, bad := range []string{"-1", "2.5", "1e3"} {
		_, err = ConsumerConfig(env(map[string]string{ConsumerName: "b", ConsumerMaxReceiveCount: bad, ConsumerStreamMaxAttempts: bad}))
		require.ErrorContains(t, err, ConsumerMaxReceiveCount+" must be a positive integer")
		require.ErrorContains(t, err, ConsumerStreamMaxAttempts+" must be a positive integer")
	}
	_, err = ConsumerConfig(env(map[string]string{ConsumerName: "b", ConsumerDeadlineMargin: "1h"}))
	require.ErrorContains(t, err, ConsumerDeadlineMargin+" must be at most 15m")
}

func TestProcessorConfig(t *testing.T) {
	t.Parallel()
	cfg, err := ProcessorConfig(env(map[string]string{ConsumerName: "billing", ProcessorMaxAttempts: "7"}))
	require.NoError(t, err)
	require.Equal(t, "billing", cfg.Consumer)
	require.Equal(t, 7, cfg.MaxAttempts)
	_, err = ProcessorConfig(env(map[string]string{ProcessorMaxAttempts: "0"}))
	require.ErrorContains(t, err, ConsumerName+" is required")
	require.ErrorContains(t, err, ProcessorMaxAttempts+" must be an integer between 1 and 1000")
}
