package lambdaenv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestPartitionSettingsNameTheVariableOfEachProblem(t *testing.T) {
	t.Parallel()
	o, err := OutboxPartitions(env(nil))
	require.NoError(t, err)
	require.Nil(t, o, "nothing set: the caller chooses")
	i, err := InboxPartitions(env(nil))
	require.NoError(t, err)
	require.Nil(t, i)

	o, err = OutboxPartitions(env(map[string]string{OutboxRetention: "720h"}))
	require.NoError(t, err)
	require.Equal(t, outbox.PartitionOptions{Interval: outbox.DefaultPartitionInterval, Retention: 720 * time.Hour}, *o)
	i, err = InboxPartitions(env(map[string]string{InboxRetention: "1000h", InboxPartitionInterval: "6h"}))
	require.NoError(t, err)
	require.Equal(t, inbox.PartitionOptions{Interval: 6 * time.Hour, Retention: 1000 * time.Hour}, *i)

	_, err = OutboxPartitions(env(map[string]string{OutboxRetention: "30 days", OutboxPartitionInterval: "500ms"}))
	require.ErrorContains(t, err, OutboxRetention+" must be a non-negative Go duration")
	require.ErrorContains(t, err, OutboxPartitionInterval+": ")
	_, err = InboxPartitions(env(map[string]string{InboxPartitionInterval: "10ms"}))
	require.ErrorContains(t, err, InboxPartitionInterval+": ")
	require.NotContains(t, err.Error(), InboxRetention)
}
