package lambdaenv

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestRelayConfigReadsEverySettingAndNamesTheVariableOfEachProblem(t *testing.T) {
	t.Parallel()
	cfg, err := RelayConfig(env(map[string]string{
		TopicARNs: `{"orders":"arn:o"}`, RelayBatchSize: "100", RelayMaxPerKey: "5", RelayPublishConcurrency: "8",
		RelayPipelines: "3", RelayMaxAttempts: "4", RelayMaxRoundBytes: "1048576", RelayPublishTimeout: "2s",
		RelayLease: "9s", RelayBackoffBase: "100ms", RelayBackoffMax: "1m", RelayOutageLimit: "2h",
		RelayPollInterval: "20ms", RelayRescanInterval: "3s",
	}))
	require.NoError(t, err)
	require.Equal(t, outbox.RelayConfig{Topics: map[string]string{"orders": "arn:o"}, BatchSize: 100, MaxPerKey: 5,
		PublishConcurrency: 8, Pipelines: 3, MaxAttempts: 4, MaxRoundBytes: 1 << 20, PublishTimeout: 2 * time.Second,
		Lease: 9 * time.Second, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Minute, OutageLimit: 2 * time.Hour,
		PollInterval: 20 * time.Millisecond, RescanInterval: 3 * time.Second}, cfg)

	_, err = RelayConfig(env(map[string]string{
		DefaultTopicARN: "arn:d", RelayBatchSize: "9223372036854775807", RelayPipelines: "0x2", RelayPollInterval: "-1s",
		RelayLease: "soon",
	}))
	require.Error(t, err)
	msg := err.Error()
	require.Contains(t, msg, RelayPipelines+" must be an integer")
	require.Contains(t, msg, RelayLease+" must be a Go duration")
	_, err = RelayConfig(env(map[string]string{DefaultTopicARN: "arn:d", RelayBatchSize: "9223372036854775807", RelayPollInterval: "-1s"}))
	require.ErrorContains(t, err, RelayBatchSize+": BatchSize must be between 1 and 10000, got 9223372036854775807")
	require.ErrorContains(t, err, RelayPollInterval+": PollInterval must be between")
	require.Less(t, strings.Index(err.Error(), RelayBatchSize), strings.Index(err.Error(), RelayPollInterval), "stable order")
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
