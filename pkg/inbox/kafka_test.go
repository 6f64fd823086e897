package inbox_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/inbox"
)

// kafkaRec builds a record of Lambda's Kafka event as the relay publishes it (the contract in
// headers, the payload as value), of event type Scripted on topic "orders".
func kafkaRec(partition, offset int64, id string, s script) events.KafkaRecord {
	body, _ := json.Marshal(s)
	h := func(k, v string) map[string]events.JSONNumberBytes {
		return map[string]events.JSONNumberBytes{k: []byte(v)}
	}
	return events.KafkaRecord{Topic: "orders", Partition: partition, Offset: offset, TimestampType: "CREATE_TIME",
		Key: base64.StdEncoding.EncodeToString([]byte("key-" + id)), Value: base64.StdEncoding.EncodeToString(body),
		Headers: []map[string]events.JSONNumberBytes{h("messageId", id), h("eventType", "Scripted"), h("createdAt", "2026-11-29T10:00:00Z")}}
}

func kafkaEvent(recs ...events.KafkaRecord) events.KafkaEvent {
	ev := events.KafkaEvent{EventSource: "aws:kafka", Records: map[string][]events.KafkaRecord{}}
	for _, r := range recs {
		k := fmt.Sprintf("%s-%d", r.Topic, r.Partition)
		ev.Records[k] = append(ev.Records[k], r)
	}
	return ev
}

func kafkaFailures(resp wire.KafkaEventResponse) []string {
	out := []string{}
	for _, f := range resp.BatchItemFailures {
		out = append(out, fmt.Sprintf("%s@%d", f.ItemIdentifier.Partition, f.ItemIdentifier.Offset))
	}
	return out
}

// The MSK fixture round-trips through events.KafkaEvent, and its records parse: the headers
// carry the contract, the value is the payload byte for byte, the key is the ordering key, and a
// record without a messageId header falls back to its place in the log.
func TestParseKafkaFixture(t *testing.T) {
	t.Parallel()
	ev := fixture.Load[events.KafkaEvent](t, "testdata/kafka_msk.json")
	msg, err := inbox.ParseKafka(ev.Records["orders-0"][0])
	require.NoError(t, err)
	require.Equal(t, "0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f7001", msg.ID)
	require.Equal(t, inbox.IDFromAttribute, msg.IDSource)
	require.Equal(t, "OrderCreated", msg.EventType)
	require.Equal(t, "order", msg.AggregateType)
	require.Equal(t, "ord-4001", msg.AggregateID)
	require.Equal(t, time.Date(2026, 11, 29, 10, 43, 20, 100_000_000, time.UTC), msg.CreatedAt)
	require.Equal(t, map[string]string{"traceparent": "00-6bf92f3577b34da6a3ce929d0e0e4736-20f067aa0ba902b7-01"}, msg.Headers)
	require.Equal(t, `{"orderId":"ord-4001","customerId":"cus-7","totalCents":1200,"currency":"EUR","schemaVersion":1}`, string(msg.Payload))
	require.Equal(t, "cus-7", msg.GroupID, "the record key, the outbox partition key")
	require.Equal(t, "kafka", msg.Source)
	require.Equal(t, "orders-0@15", msg.ItemID)

	msg, err = inbox.ParseKafka(ev.Records["orders-1"][0])
	require.NoError(t, err)
	require.Equal(t, "kafka://orders/1/4", msg.ID)
	require.Equal(t, inbox.IDFromKafka, msg.IDSource)
	require.True(t, msg.CreatedAt.IsZero())
}

func TestParseKafkaBadInput(t *testing.T) {
	t.Parallel()
	good := kafkaRec(0, 1, "m1", script{N: 1})
	notBase64 := good
	notBase64.Value = "%%%"
	notJSON := good
	notJSON.Value = base64.StdEncoding.EncodeToString([]byte("hello"))
	noHeaders := good
	noHeaders.Headers = nil
	binaryType := good
	binaryType.Headers = append([]map[string]events.JSONNumberBytes{}, good.Headers...)
	binaryType.Headers[1] = map[string]events.JSONNumberBytes{"eventType": {0xff, 0xfe}}
	tombstone := good
	tombstone.Value = ""
	for _, tc := range []struct {
		name string
		rec  events.KafkaRecord
		want string
	}{
		{"value not base64", notBase64, "not base64"},
		{"value not JSON", notJSON, "body is not JSON"},
		{"no headers", noHeaders, "the record has no headers"},
		{"event type not text", binaryType, "header eventType is not valid UTF-8 text"},
		{"tombstone", tombstone, "empty body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := inbox.ParseKafka(tc.rec)
			require.ErrorIs(t, err, inbox.ErrBadMessage)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// The fixture applied twice: every record once, the second invocation all duplicates, no failures.
func TestHandleKafkaAppliesOnce(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "k", Router: effectRouter("k", "OrderCreated", "OrderCancelled"), Mode: mode, Logger: quiet})
		require.NoError(t, err)
		ev := fixture.Load[events.KafkaEvent](t, "testdata/kafka_msk.json")
		for range 2 {
			resp, err := c.HandleKafka(context.Background(), ev)
			require.NoError(t, err)
			require.Empty(t, resp.BatchItemFailures)
			require.NotNil(t, resp.BatchItemFailures, "an empty list, not null")
		}
		require.Equal(t, []string{"k/0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f7001/1", "k/0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f7002/1", "k/kafka://orders/1/4/1"},
			dbState(t, b.pool).Effects)
	})
}

// A failing record fails the rest of its partition, unattempted, so Lambda resumes the
// partition at it and its records are applied in offset order; other partitions go on. The
// redelivery from the failed offset applies the rest once.
func TestHandleKafkaFailureBlocksOnlyItsPartition(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		c := newConsumer(t, b.pool, "k", mode)
		ctx := context.Background()
		resp, err := c.HandleKafka(ctx, kafkaEvent(
			kafkaRec(0, 10, "p0-10", script{N: 10}),
			kafkaRec(0, 11, "p0-11", script{N: 11, Fail: "error"}),
			kafkaRec(0, 12, "p0-12", script{N: 12}),
			kafkaRec(1, 5, "p1-5", script{N: 5}),
			kafkaRec(1, 6, "p1-6", script{N: 6}),
		))
		require.NoError(t, err)
		require.Equal(t, []string{"orders-0@11", "orders-0@12"}, kafkaFailures(resp))
		require.Equal(t, []string{"k/p0-10/10", "k/p1-5/5", "k/p1-6/6"}, dbState(t, b.pool).Effects, "nothing past the failure")

		// Lambda resumes partition 0 at offset 11 (the failure is gone: a transient one).
		resp, err = c.HandleKafka(ctx, kafkaEvent(kafkaRec(0, 11, "p0-11", script{N: 11}), kafkaRec(0, 12, "p0-12", script{N: 12})))
		require.NoError(t, err)
		require.Empty(t, resp.BatchItemFailures)
		require.Equal(t, []string{"k/p0-10/10", "k/p0-11/11", "k/p0-12/12", "k/p1-5/5", "k/p1-6/6"}, dbState(t, b.pool).Effects)
	})
}

// A record that cannot be parsed blocks its partition like a failing handler.
func TestHandleKafkaUnparseableRecordBlocksItsPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, b.pool, "k", inbox.PerRecord)
	bad := kafkaRec(0, 2, "p0-2", script{N: 2})
	bad.Value = base64.StdEncoding.EncodeToString([]byte("not json"))
	resp, err := c.HandleKafka(context.Background(), kafkaEvent(kafkaRec(0, 1, "p0-1", script{N: 1}), bad, kafkaRec(0, 3, "p0-3", script{N: 3}), kafkaRec(1, 1, "p1-1", script{N: 1})))
	require.NoError(t, err)
	require.Equal(t, []string{"orders-0@2", "orders-0@3"}, kafkaFailures(resp))
	require.Equal(t, []string{"k/p0-1/1", "k/p1-1/1"}, dbState(t, b.pool).Effects)
}

// The response has the shape the Kafka event source mapping reads: itemIdentifier is an object.
func TestKafkaEventResponseJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(wire.KafkaEventResponse{BatchItemFailures: []wire.KafkaBatchItemFailure{{ItemIdentifier: wire.KafkaItemIdentifier{Partition: "orders-3", Offset: 42}}}})
	require.NoError(t, err)
	require.JSONEq(t, `{"batchItemFailures":[{"itemIdentifier":{"partition":"orders-3","offset":42}}]}`, string(b))
}

// HandleEvent recognises each event source by its eventSource and answers in its shape.
func TestHandleEventDispatchesOnTheEventSource(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "any", Router: effectRouter("any", "OrderCreated", "OrderCancelled", "OrderShipped"), Logger: quiet})
	require.NoError(t, err)
	ctx := context.Background()
	for _, tc := range []struct {
		file string
		want any
	}{
		{"testdata/sqs_sns_envelope.json", events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{}}},
		{"testdata/kinesis.json", events.KinesisEventResponse{BatchItemFailures: []events.KinesisBatchItemFailure{}}},
		{"testdata/kafka_msk.json", wire.KafkaEventResponse{BatchItemFailures: []wire.KafkaBatchItemFailure{}}},
	} {
		raw, err := os.ReadFile(tc.file)
		require.NoError(t, err)
		resp, err := c.HandleEvent(ctx, raw)
		require.NoError(t, err, tc.file)
		require.Equal(t, tc.want, resp, tc.file)
	}
	require.Equal(t, 7, count(t, b.pool, `SELECT count(*) FROM effect`), "every record of the three fixtures applied")

	selfManaged := kafkaEvent(kafkaRec(0, 1, "sm-1", script{N: 1}))
	selfManaged.EventSource = "SelfManagedKafka"
	raw, _ := json.Marshal(selfManaged)
	resp, err := c.HandleEvent(ctx, raw)
	require.NoError(t, err)
	require.IsType(t, wire.KafkaEventResponse{}, resp)

	resp, err = c.HandleEvent(ctx, json.RawMessage(`{"Records":[]}`))
	require.NoError(t, err)
	require.Equal(t, events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{}}, resp, "an empty batch: no failures")
	for _, bad := range []string{`{"detail-type":"Scheduled Event"}`, `{"Records":[{"eventSource":"aws:dynamodb"}]}`, `[1]`} {
		_, err = c.HandleEvent(ctx, json.RawMessage(bad))
		require.ErrorIs(t, err, inbox.ErrUnknownEventSource, bad)
	}
}

// effectRouter handles eventTypes by writing one effect row per message.
func effectRouter(consumer string, eventTypes ...string) *inbox.Router {
	r := inbox.NewRouter(inbox.FailUnknown)
	for _, typ := range eventTypes {
		r.Handle(typ, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ($1, $2, 1)`, consumer, msg.ID)
			return err
		})
	}
	return r
}

// A Kafka record's consumer span is a child of the writer's span (traceparent header) and
// names Kafka and the topic.
func TestHandleKafkaSpans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, exp := spans(t)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "k", Router: router("k"), Logger: quiet, TracerProvider: tp})
	require.NoError(t, err)
	_, span := tp.Tracer("producer").Start(context.Background(), "place order")
	span.End()
	sc := span.SpanContext()
	r := kafkaRec(0, 1, "traced", script{N: 1})
	r.Headers = append(r.Headers, map[string]events.JSONNumberBytes{"traceparent": []byte(fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()))})
	exp.Reset()
	resp, err := c.HandleKafka(context.Background(), kafkaEvent(r))
	require.NoError(t, err)
	require.Empty(t, resp.BatchItemFailures)
	s := byMessage(t, exp)["traced"][0]
	require.Len(t, s.Links, 1)
	require.Equal(t, sc.SpanID(), s.Links[0].SpanContext.SpanID(), "linked to the writer's span")
	require.Equal(t, "process orders", s.Name)
	require.Equal(t, "kafka", attrsOf(s)["messaging.system"])
	require.Equal(t, "orders", attrsOf(s)["messaging.destination.name"])
	require.Equal(t, "0", attrsOf(s)["messaging.destination.partition.id"])
	require.Equal(t, int64(1), attrsOf(s)["messaging.kafka.offset"])
}
