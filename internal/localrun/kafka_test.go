package localrun

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// Records as the relay produces them become the Lambda Kafka event, which survives JSON (the
// function receives it so) and parses in the inbox to the event the relay published.
func TestKafkaEventHasTheLambdaShape(t *testing.T) {
	t.Parallel()
	e := &outbox.Event{EventID: uuid.New(), EventType: "OrderCreated", AggregateType: "order", AggregateID: "o-1", PartitionKey: "c-1",
		Payload: []byte(`{"orderId":"o-1"}`), Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		CreatedAt: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)}
	var rec recordOf
	require.NoError(t, errors.Join(outbox.NewKafkaPublisher(&rec, 0).PublishBatch(context.Background(), "kafka://orders", []*outbox.Event{e})...))
	r := rec.r
	r.Partition, r.Offset = 3, 42
	ev := KafkaEvent(map[string][]*kgo.Record{"orders-3": {r}}, DefaultKafkaClusterARN, "127.0.0.1:9092")

	b, err := json.Marshal(ev)
	require.NoError(t, err)
	var got events.KafkaEvent
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, "aws:kafka", got.EventSource)
	require.Len(t, got.Records["orders-3"], 1)
	msg, err := inbox.ParseKafka(got.Records["orders-3"][0])
	require.NoError(t, err)
	require.Equal(t, e.EventID.String(), msg.ID)
	require.Equal(t, inbox.IDFromAttribute, msg.IDSource)
	require.Equal(t, "OrderCreated", msg.EventType)
	require.Equal(t, "c-1", msg.GroupID)
	require.Equal(t, e.CreatedAt, msg.CreatedAt)
	require.Equal(t, `{"orderId":"o-1"}`, string(msg.Payload))
	require.Equal(t, e.Headers["traceparent"], msg.Traceparent())
	require.Equal(t, "orders-3@42", msg.ItemID)
}

// recordOf keeps the record the relay's publisher produces, and acknowledges it.
type recordOf struct{ r *kgo.Record }

func (o *recordOf) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	o.r = rs[0]
	return kgo.ProduceResults{{Record: rs[0]}}
}
