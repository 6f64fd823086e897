package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/localaws"
)

// The retention of a Kinesis stream is read from the stream, by name or ARN; a missing stream
// is an error naming it.
func TestKinesisRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kc := kinesis.NewFromConfig(localaws.TestConfigServing(t, localaws.ServiceKinesis))
	name := "retention-" + uuid.NewString()[:8]
	_, err := kc.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(1)})
	require.NoError(t, err)
	require.NoError(t, kinesis.NewStreamExistsWaiter(kc, func(o *kinesis.StreamExistsWaiterOptions) { o.MinDelay = 100 * time.Millisecond }).
		Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(name)}, time.Minute))
	_, err = kc.IncreaseStreamRetentionPeriod(ctx, &kinesis.IncreaseStreamRetentionPeriodInput{StreamName: aws.String(name), RetentionPeriodHours: aws.Int32(24 * 30)})
	require.NoError(t, err)

	got, err := admin.KinesisRetention(ctx, kc, name)
	require.NoError(t, err)
	require.Equal(t, 30*24*time.Hour, got)
	d, err := kc.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
	require.NoError(t, err)
	got, err = admin.KinesisRetention(ctx, kc, aws.ToString(d.StreamDescriptionSummary.StreamARN))
	require.NoError(t, err)
	require.Equal(t, 30*24*time.Hour, got)

	_, err = admin.KinesisRetention(ctx, kc, "no-such-stream-"+name)
	require.ErrorContains(t, err, "read the retention of Kinesis stream no-such-stream-"+name)
}

// The retention of a Kafka topic is its retention.ms, Forever when -1 or compacted, and the
// broker's answer for a missing topic is an error naming it.
func TestKafkaRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	kc, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	create := func(topic string, configs map[string]string) {
		t.Helper()
		req := kmsg.NewPtrCreateTopicsRequest()
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 1, 1
		for k, v := range configs {
			cfg := kmsg.NewCreateTopicsRequestTopicConfig()
			cfg.Name, cfg.Value = k, kmsg.StringPtr(v)
			rt.Configs = append(rt.Configs, cfg)
		}
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, kc)
		require.NoError(t, err)
		require.Zero(t, resp.Topics[0].ErrorCode)
	}
	create("ten-days", map[string]string{"retention.ms": "864000000"})
	create("forever", map[string]string{"retention.ms": "-1"})
	create("compacted", map[string]string{"cleanup.policy": "compact"})
	create("default", nil)

	got, err := admin.KafkaRetention(ctx, kc, "ten-days")
	require.NoError(t, err)
	require.Equal(t, 10*24*time.Hour, got)
	for _, topic := range []string{"forever", "compacted"} {
		got, err = admin.KafkaRetention(ctx, kc, topic)
		require.NoError(t, err)
		require.Equal(t, admin.Forever, got, topic)
	}
	got, err = admin.KafkaRetention(ctx, kc, "default")
	require.NoError(t, err)
	require.Equal(t, 7*24*time.Hour, got, "the broker's default, log.retention.hours 168")
	_, err = admin.KafkaRetention(ctx, kc, "missing")
	require.ErrorContains(t, err, "read the retention of Kafka topic missing")
}
