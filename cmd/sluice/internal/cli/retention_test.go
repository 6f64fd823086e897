package cli_test

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

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/localaws"
)

// purge --json reports the retention bound it checked in seconds, as its name says.
func TestPurgeJSONReportsTheRetentionBoundInSeconds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	plan := lineOf(t, jsonLines(t, b.ok(t, "purge", "--older-than", "30d", "--dry-run", "--json")), "plan")["plan"].(map[string]any)
	require.EqualValues(t, 14*24*3600, plan["retention_bound_seconds"])
}

// The inbox retention guard reads a Kinesis stream's retention: an --older-than within it is
// refused, naming the stream, and one beyond it purges.
func TestPurgeRefusesAnInboxRetentionWithinAKinesisStreamsRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	endpoint := localaws.TestEndpointServing(t, localaws.ServiceKinesis)
	b.env["AWS_ENDPOINT_URL"] = endpoint
	kc := kinesis.NewFromConfig(localaws.TestConfigServing(t, localaws.ServiceKinesis))
	name := "cli-retention-" + uuid.NewString()[:8]
	_, err := kc.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(1)})
	require.NoError(t, err)
	require.NoError(t, kinesis.NewStreamExistsWaiter(kc, func(o *kinesis.StreamExistsWaiterOptions) { o.MinDelay = 100 * time.Millisecond }).
		Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(name)}, time.Minute))
	_, err = kc.IncreaseStreamRetentionPeriod(ctx, &kinesis.IncreaseStreamRetentionPeriodInput{StreamName: aws.String(name), RetentionPeriodHours: aws.Int32(30 * 24)})
	require.NoError(t, err)
	b.insertInbox(t, "billing", "old", "processed", 40*24*time.Hour)
	before := b.fingerprint(t)

	r := b.run(t, "purge", "--inbox-only", "--older-than", "20d", "--kinesis-stream", name, "--yes")
	requireOneLineError(t, r, cli.ExitError, "not longer than the message retention of Kinesis stream "+name+" (30d)")
	require.Equal(t, before, b.fingerprint(t))
	plan := lineOf(t, jsonLines(t, b.ok(t, "purge", "--inbox-only", "--older-than", "31d", "--kinesis-stream", name, "--dry-run", "--json")), "plan")["plan"].(map[string]any)
	require.EqualValues(t, 30*24*3600, plan["retention_bound_seconds"])
	require.Equal(t, "Kinesis stream "+name, plan["retention_from"])
	require.Contains(t, b.ok(t, "purge", "--inbox-only", "--older-than", "31d", "--kinesis-stream", name, "--yes"), "deleted 1 processed inbox rows")

	r = b.run(t, "purge", "--inbox-only", "--older-than", "31d", "--kinesis-stream", "no-such-"+name, "--yes")
	requireOneLineError(t, r, cli.ExitError, "read the retention of Kinesis stream no-such-"+name)
	require.Contains(t, r.err, "--source-retention")
}

// The guard reads a Kafka topic's retention.ms from the brokers the relay uses: a topic that
// keeps its records forever refuses any inbox purge; one of 10 days refuses 5 and allows 11.
func TestPurgeRefusesAnInboxRetentionWithinAKafkaTopicsRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	kc, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	for topic, ms := range map[string]string{"orders-forever": "-1", "orders-10d": "864000000"} {
		req := kmsg.NewPtrCreateTopicsRequest()
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 1, 1
		cfg := kmsg.NewCreateTopicsRequestTopicConfig()
		cfg.Name, cfg.Value = "retention.ms", kmsg.StringPtr(ms)
		rt.Configs = append(rt.Configs, cfg)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, kc)
		require.NoError(t, err)
		require.Zero(t, resp.Topics[0].ErrorCode)
	}
	b.env["SLUICE_KAFKA_BROKERS"] = c.ListenAddrs()[0]
	b.insertInbox(t, "billing", "old", "processed", 40*24*time.Hour)
	before := b.fingerprint(t)

	r := b.run(t, "purge", "--inbox-only", "--older-than", "400d", "--kafka-topic", "orders-forever", "--yes")
	requireOneLineError(t, r, cli.ExitError, "Kafka topic orders-forever keeps its messages without a time limit")
	r = b.run(t, "purge", "--inbox-only", "--older-than", "5d", "--kafka-topic", "orders-10d", "--yes")
	requireOneLineError(t, r, cli.ExitError, "message retention of Kafka topic orders-10d (10d)")
	require.Equal(t, before, b.fingerprint(t))
	plan := lineOf(t, jsonLines(t, b.ok(t, "purge", "--inbox-only", "--older-than", "400d", "--kafka-topic", "orders-forever",
		"--allow-duplicate-applies", "--dry-run", "--json")), "plan")["plan"].(map[string]any)
	require.EqualValues(t, -1, plan["retention_bound_seconds"], "forever")
	require.Contains(t, b.ok(t, "purge", "--inbox-only", "--older-than", "11d", "--kafka-topic", "orders-10d", "--yes"), "deleted 1 processed inbox rows")
}
