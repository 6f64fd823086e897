package lambdaenv

import (
	"context"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// SLUICE_KAFKA_MAX_MESSAGE_BYTES reaches franz-go: the relay's client lets a record batch be
// as large as the setting (issue 21, item 2: it stayed at franz-go's 1,000,012 and a 2 MiB
// record with the setting at 4 MiB failed MESSAGE_TOO_LARGE), and the default is the
// documented constant.
func TestKafkaMaxMessageBytesReachesTheProducer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		setting string
		want    int
	}{{"", 1_000_000}, {strconv.Itoa(4 << 20), 4 << 20}} {
		env := map[string]string{KafkaBrokers: "127.0.0.1:1", "SLUICE_KAFKA_MAX_MESSAGE_BYTES": tc.setting}
		client, maxBytes, err := relayKafkaClient(context.Background(), func(k string) string { return env[k] }, aws.Config{})
		require.NoError(t, err)
		require.Equal(t, tc.want, maxBytes)
		require.Equal(t, int32(tc.want), client.OptValue(kgo.ProducerBatchMaxBytes))
		client.Close()
	}
}

// Each destination's limit is a setting read by RelaySettings, with AWS's current value as
// its default, and refused outside what the service allows, naming the variable.
func TestMessageLimitSettings(t *testing.T) {
	t.Parallel()
	cfg, err := RelaySettings(func(string) string { return "" })
	require.NoError(t, err)
	require.Equal(t, outbox.MessageLimits{SNS: 262_144, SQS: 262_144, EventBridge: 262_143, Kinesis: 1 << 20, Kafka: 1_000_000}, cfg.MessageLimits.WithDefaults())

	env := map[string]string{"SLUICE_KINESIS_MAX_RECORD_BYTES": strconv.Itoa(10 << 20), "SLUICE_SNS_MAX_MESSAGE_BYTES": strconv.Itoa(1 << 20),
		"SLUICE_SQS_MAX_MESSAGE_BYTES": strconv.Itoa(1 << 20)}
	cfg, err = RelaySettings(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, 10<<20, cfg.MessageLimits.Of(outbox.Kinesis))
	require.Equal(t, 1<<20, cfg.MessageLimits.Of(outbox.SNS))
	require.Equal(t, 262_143, cfg.MessageLimits.Of(outbox.EventBridge))

	env = map[string]string{"SLUICE_KINESIS_MAX_RECORD_BYTES": strconv.Itoa(11 << 20), "SLUICE_EVENTBRIDGE_MAX_ENTRY_BYTES": "300000",
		"SLUICE_SNS_MAX_MESSAGE_BYTES": "100"}
	_, err = RelaySettings(func(k string) string { return env[k] })
	require.Error(t, err)
	for v := range env {
		require.ErrorContains(t, err, v+": MessageLimits.")
	}
}

// A consumer Lambda fetches only from the relay's bucket and prefix, with the bucket's owner
// (issue 21, item 5).
func TestConsumerClaimCheckIsPinnedToTheRelaysLocation(t *testing.T) {
	t.Parallel()
	env := map[string]string{ClaimCheckBucket: "acme-payloads", ClaimCheckPrefix: "outbox/", ClaimCheckBucketOwner: "111122223333"}
	cc, err := consumerClaimCheck(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, []inbox.PayloadLocation{{Bucket: "acme-payloads", KeyPrefix: "outbox/", ExpectedBucketOwner: "111122223333"}}, cc.Locations)
}
