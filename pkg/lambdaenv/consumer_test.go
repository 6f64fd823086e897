package lambdaenv

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
)

func TestConsumerConfigReadsEverySettingAndDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := ConsumerConfig(env(map[string]string{ConsumerName: "billing"}))
	require.NoError(t, err)
	require.Equal(t, inbox.Config{Consumer: "billing", Mode: DefaultConsumerCommitMode, DeadlineMargin: DefaultConsumerDeadlineMargin,
		StorePayload: DefaultConsumerStorePayload}, cfg)

	cfg, err = ConsumerConfig(env(map[string]string{ConsumerName: " billing ", ConsumerCommitMode: "batched",
		ConsumerDeadlineMargin: "-1s", ConsumerStorePayload: "true"}))
	require.NoError(t, err)
	require.Equal(t, inbox.Config{Consumer: "billing", Mode: inbox.Batched, DeadlineMargin: -time.Second, StorePayload: true}, cfg)
}

func TestConsumerConfigRefusesAsyncAndNamesEveryProblem(t *testing.T) {
	t.Parallel()
	_, err := ConsumerConfig(env(map[string]string{ConsumerName: "billing", ConsumerCommitMode: "async"}))
	require.ErrorIs(t, err, ErrAsyncWithoutProcessor)
	require.ErrorContains(t, err, ConsumerCommitMode+": commit mode async needs an inbox Processor")

	_, err = ConsumerConfig(env(map[string]string{ConsumerCommitMode: "eventually", ConsumerDeadlineMargin: "soon",
		ConsumerStorePayload: "maybe"}))
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrAsyncWithoutProcessor))
	for _, want := range []string{ConsumerName + " is required", ConsumerCommitMode + " must be per-record or batched",
		ConsumerDeadlineMargin + " must be a Go duration", ConsumerStorePayload + " must be true or false"} {
		require.ErrorContains(t, err, want)
	}
	_, err = ConsumerConfig(env(map[string]string{ConsumerName: "b", ConsumerDeadlineMargin: "1h"}))
	require.ErrorContains(t, err, ConsumerDeadlineMargin+" must be at most 15m")
}
