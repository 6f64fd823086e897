package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/inbox"
)

const testStream = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"

// kinesisRec builds a record of shard whose data is the relay's envelope around a Scripted payload.
func kinesisRec(shard string, seq int, id string, s script) events.KinesisEventRecord {
	payload, _ := json.Marshal(s)
	data, _ := json.Marshal(wire.Envelope{Metadata: wire.EnvelopeMetadata{MessageID: id, EventType: "Scripted", PartitionKey: "key-" + id,
		CreatedAt: "2026-11-29T10:00:00Z"}, Data: payload})
	sn := fmt.Sprintf("4959%046d", seq)
	return events.KinesisEventRecord{EventSource: "aws:kinesis", EventSourceArn: testStream, EventID: shard + ":" + sn, EventName: "aws:kinesis:record",
		Kinesis: events.KinesisRecord{Data: data, PartitionKey: "key-" + id, SequenceNumber: sn, KinesisSchemaVersion: "1.0"}}
}

func kinesisFailures(resp events.KinesisEventResponse) []string {
	out := []string{}
	for _, f := range resp.BatchItemFailures {
		out = append(out, f.ItemIdentifier)
	}
	return out
}

// The Kinesis fixture round-trips through events.KinesisEvent, and its records' data parses as
// the relay's envelope; a record without metadata.messageId falls back to its place in the stream.
func TestParseKinesisFixture(t *testing.T) {
	t.Parallel()
	ev := fixture.Load[events.KinesisEvent](t, "testdata/kinesis.json")
	msg, err := inbox.ParseKinesis(ev.Records[0])
	require.NoError(t, err)
	require.Equal(t, "0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f8001", msg.ID)
	require.Equal(t, inbox.IDFromAttribute, msg.IDSource)
	require.Equal(t, "OrderCreated", msg.EventType)
	require.Equal(t, "ord-5001", msg.AggregateID)
	require.Equal(t, time.Date(2026, 11, 29, 10, 45, 0, 250_000_000, time.UTC), msg.CreatedAt)
	require.Equal(t, "00-7bf92f3577b34da6a3ce929d0e0e4736-30f067aa0ba902b7-01", msg.Traceparent())
	require.Equal(t, `{"orderId":"ord-5001","customerId":"cus-9","totalCents":4500,"currency":"USD","schemaVersion":1}`, string(msg.Payload))
	require.Equal(t, "cus-9", msg.GroupID)
	require.Equal(t, "aws:kinesis", msg.Source)
	require.Equal(t, ev.Records[0].Kinesis.SequenceNumber, msg.ItemID)

	msg, err = inbox.ParseKinesis(ev.Records[1])
	require.NoError(t, err)
	require.Equal(t, testStream+"/shardId-000000000003/"+ev.Records[1].Kinesis.SequenceNumber, msg.ID)
	require.Equal(t, inbox.IDFromKinesis, msg.IDSource)
}

func TestParseKinesisBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, data, want string }{
		{"not JSON", `hello`, "Kinesis record data is not a sluice envelope"},
		{"no metadata", `{"orderId":1}`, "no metadata"},
		{"no event type", `{"metadata":{"messageId":"m"},"data":{}}`, "missing metadata field eventType"},
		{"bad createdAt", `{"metadata":{"messageId":"m","eventType":"X","createdAt":"now"},"data":{}}`, "not an RFC 3339 time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := kinesisRec("shardId-000000000000", 1, "m", script{})
			r.Kinesis.Data = []byte(tc.data)
			_, err := inbox.ParseKinesis(r)
			require.ErrorIs(t, err, inbox.ErrBadMessage)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestHandleKinesisAppliesOnce(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "s", Router: effectRouter("s", "OrderCreated", "OrderCancelled"), Mode: mode, Logger: quiet})
		require.NoError(t, err)
		ev := fixture.Load[events.KinesisEvent](t, "testdata/kinesis.json")
		for range 2 {
			resp, err := c.HandleKinesis(context.Background(), ev)
			require.NoError(t, err)
			require.Empty(t, resp.BatchItemFailures)
		}
		require.Len(t, dbState(t, b.pool).Effects, 2)
	})
}

// Lambda checkpoints a shard at the lowest reported sequence number: after a failure every later
// record of the shard is reported too and none is applied; another shard goes on.
func TestHandleKinesisFailureBlocksOnlyItsShard(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c := newConsumer(t, b.pool, "s", mode)
		const a, other = "shardId-000000000000", "shardId-000000000001"
		recs := []events.KinesisEventRecord{
			kinesisRec(a, 1, "a1", script{N: 1}),
			kinesisRec(a, 2, "a2", script{N: 2, Fail: "panic"}),
			kinesisRec(other, 3, "b3", script{N: 3}),
			kinesisRec(a, 4, "a4", script{N: 4}),
		}
		resp, err := c.HandleKinesis(context.Background(), events.KinesisEvent{Records: recs})
		require.NoError(t, err)
		require.Equal(t, []string{recs[1].Kinesis.SequenceNumber, recs[3].Kinesis.SequenceNumber}, kinesisFailures(resp))
		require.Equal(t, []string{"s/a1/1", "s/b3/3"}, dbState(t, b.pool).Effects)

		// Lambda retries from the checkpoint.
		recs[1] = kinesisRec(a, 2, "a2", script{N: 2})
		resp, err = c.HandleKinesis(context.Background(), events.KinesisEvent{Records: []events.KinesisEventRecord{recs[1], recs[3]}})
		require.NoError(t, err)
		require.Empty(t, resp.BatchItemFailures)
		require.Equal(t, []string{"s/a1/1", "s/a2/2", "s/a4/4", "s/b3/3"}, dbState(t, b.pool).Effects)
	})
}
