package lambdaenv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/partition"
)

func TestPartitionSettingsNameTheVariableOfEachProblem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		table               *partition.Table
		retention, interval string
	}{
		{partition.Outbox, OutboxRetention, OutboxPartitionInterval},
		{partition.Inbox, InboxRetention, InboxPartitionInterval},
	} {
		t.Run(tc.table.Name(), func(t *testing.T) {
			t.Parallel()
			o, err := Partitions(env(nil), tc.table)
			require.NoError(t, err)
			require.Nil(t, o, "nothing set: the caller chooses")

			o, err = Partitions(env(map[string]string{tc.retention: "720h"}), tc.table)
			require.NoError(t, err)
			require.Equal(t, partition.Options{Interval: partition.DefaultInterval, Retention: 720 * time.Hour}, *o)
			o, err = Partitions(env(map[string]string{tc.retention: "1000h", tc.interval: "6h"}), tc.table)
			require.NoError(t, err)
			require.Equal(t, partition.Options{Interval: 6 * time.Hour, Retention: 1000 * time.Hour}, *o)

			_, err = Partitions(env(map[string]string{tc.retention: "30 days", tc.interval: "500ms"}), tc.table)
			require.ErrorContains(t, err, tc.retention+" must be a non-negative Go duration")
			require.ErrorContains(t, err, tc.interval+": ")
			_, err = Partitions(env(map[string]string{tc.interval: "10ms"}), tc.table)
			require.ErrorContains(t, err, tc.interval+": ")
			require.NotContains(t, err.Error(), tc.retention)
			// The other table's variables are not this table's.
			o, err = Partitions(env(map[string]string{OutboxRetention + "x": "1h"}), tc.table)
			require.NoError(t, err)
			require.Nil(t, o)
		})
	}
}
