package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/wire"
)

// The skeleton starts HandleEvent: the same binary serves an SQS and a Kafka (MSK) event source
// mapping, answering each in its partial batch response shape.
func TestSkeletonServesSQSAndKafka(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var logs bytes.Buffer
	c, err := newConsumer(pool, consumerConfig(t, "billing"), slog.New(slog.NewJSONHandler(&logs, nil)))
	require.NoError(t, err)
	fixture.Load[events.KafkaEvent](t, "testdata/kafka_order_created.json")
	for _, tc := range []struct {
		file string
		want any
	}{
		{"testdata/sqs_order_created.json", events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{}}},
		{"testdata/kafka_order_created.json", wire.KafkaEventResponse{BatchItemFailures: []wire.KafkaBatchItemFailure{}}},
	} {
		raw, err := os.ReadFile(tc.file)
		require.NoError(t, err)
		resp, err := c.HandleEvent(ctx, json.RawMessage(raw))
		require.NoError(t, err)
		require.Equal(t, tc.want, resp, tc.file)
	}
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-42"`)))
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-43"`)))
}
