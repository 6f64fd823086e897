package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func scheduledEvent(t *testing.T) events.EventBridgeEvent {
	t.Helper()
	return fixture.Load[events.EventBridgeEvent](t, "testdata/scheduled_event.json")
}

func TestScheduledEventFixtureRoundTrips(t *testing.T) {
	t.Parallel()
	ev := scheduledEvent(t)
	require.Equal(t, "Scheduled Event", ev.DetailType)
	require.Equal(t, "aws.events", ev.Source)
}

// The handler publishes what is pending and returns stopBefore ahead of the deadline.
func TestHandleRunsUntilShortlyBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	snsc := sns.NewFromConfig(localaws.TestConfig(t))
	topic, err := snsc.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String("relay-handler-test")})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	for range 5 {
		_, err = outbox.Write(ctx, tx, outbox.Message{Topic: "orders", EventType: "OrderCreated", AggregateID: "o-1", Payload: []byte(`{"n":1}`)})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))

	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: outbox.NewSNSPublisher(snsc),
		Topics: map[string]string{"orders": aws.ToString(topic.TopicArn)}, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	h := &handler{relay: relay, lag: pool, stopBefore: time.Second, log: slog.New(slog.DiscardHandler)}
	// 14s to publish 5 rows: ample on a machine whose cores are busy and whose emulator serves
	// other tests (moto under the end-to-end suite answered in seconds); the test is about
	// returning before the deadline with nothing pending, not about speed. The handler polls
	// until then, so this is also how long the test takes.
	deadline := time.Now().Add(15 * time.Second)
	ictx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	res, err := h.Handle(ictx, scheduledEvent(t))
	require.NoError(t, err)
	require.Zero(t, res.Pending, "everything was published")
	require.Zero(t, res.Quarantined)
	require.True(t, time.Now().Before(deadline), "returned before the invocation deadline")
	out, err := json.Marshal(res)
	require.NoError(t, err)
	require.Contains(t, string(out), `"pending":0`)
}

func TestRelayConfigFromEnvironment(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		lambdaenv.TopicARNs: `{"orders":"arn:aws:sns:eu-west-1:1:orders"}`, "SLUICE_RELAY_BATCH_SIZE": "50",
		"SLUICE_RELAY_LEASE": "4s", "SLUICE_RELAY_PUBLISH_TIMEOUT": "3s", lambdaenv.RelayStopBefore: "2s",
	}
	cfg, stop, err := relayConfig(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, 50, cfg.BatchSize)
	require.Equal(t, 4*time.Second, cfg.Lease)
	require.Equal(t, 3*time.Second, cfg.PublishTimeout)
	require.Equal(t, 2*time.Second, stop)
	require.Equal(t, "arn:aws:sns:eu-west-1:1:orders", cfg.Topics["orders"])

	_, stop, err = relayConfig(func(k string) string { return map[string]string{lambdaenv.DefaultTopicARN: "arn:x"}[k] })
	require.NoError(t, err)
	require.Equal(t, lambdaenv.DefaultRelayStopBefore, stop)

	env["SLUICE_RELAY_BATCH_SIZE"] = "many"
	_, _, err = relayConfig(func(k string) string { return env[k] })
	require.ErrorContains(t, err, "SLUICE_RELAY_BATCH_SIZE")
}
