package inbox

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/aws/aws-lambda-go/events"
	otelattr "go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluicehq/sluice/internal/wire"
)

// HandleKafka is the Lambda handler for an Amazon MSK or self-managed Apache Kafka event source
// mapping with ReportBatchItemFailures:
//
//	lambda.StartWithOptions(consumer.HandleKafka, lambda.WithEnableSIGTERM(pool.Close))
//
// Each record is applied with the same transaction and inbox rules as an SQS record, partitions
// in the order of their keys and each partition's records in offset order. Lambda resumes a
// partition from the lowest offset reported failed, so after a record fails every later record
// of its partition is reported failed too without being attempted (ErrGroupBlocked): a
// partition's records are applied in order, never past a failure. Other partitions go on. It
// never returns an error: failures are per record, in the response's BatchItemFailures, each
// naming its topic-partition and offset ({"itemIdentifier": {"partition": "orders-3", "offset":
// 42}}; aws-lambda-go has no type for this response). See docs/inbox.md for the mapping's
// settings and what a poison record does.
func (c *Consumer) HandleKafka(ctx context.Context, event events.KafkaEvent) (wire.KafkaEventResponse, error) {
	var (
		ds  []delivery
		ids []wire.KafkaItemIdentifier
	)
	for _, tp := range slices.Sorted(maps.Keys(event.Records)) {
		recs := slices.SortedStableFunc(slices.Values(event.Records[tp]), func(a, b events.KafkaRecord) int { return cmp.Compare(a.Offset, b.Offset) })
		for _, r := range recs {
			ds = append(ds, lambdaKafkaDelivery(tp, r))
			ids = append(ids, wire.KafkaItemIdentifier{Partition: tp, Offset: r.Offset})
		}
	}
	rep := c.run(ctx, ds)
	resp := wire.KafkaEventResponse{BatchItemFailures: []wire.KafkaBatchItemFailure{}}
	for i, res := range rep.Results {
		if res.Outcome == Failed {
			resp.BatchItemFailures = append(resp.BatchItemFailures, wire.KafkaBatchItemFailure{ItemIdentifier: ids[i]})
		}
	}
	return resp, nil
}

// kafkaRecord is a Kafka record as Lambda's event and a franz-go client both give it.
type kafkaRecord struct {
	topic     string
	partition int64
	offset    int64
	key       []byte
	value     []byte
	headers   []kafkaHeader // in record order
}

type kafkaHeader struct {
	key   string
	value []byte
}

// topicPartition is the record's ordering group and the key of Lambda's records map: "orders-3".
func (r kafkaRecord) topicPartition() string {
	return r.topic + "-" + strconv.FormatInt(r.partition, 10)
}

// itemID is the record in logs and reports: "orders-3@42".
func (r kafkaRecord) itemID() string {
	return r.topicPartition() + "@" + strconv.FormatInt(r.offset, 10)
}

// message turns the record into a Message: the value is the payload, the headers are the
// contract's attributes and the message's headers (the last of a repeated header wins), the key
// is the ordering key. Without a messageId header the dedup key is kafka://TOPIC/PARTITION/OFFSET
// (IDFromKafka).
func (r kafkaRecord) message() (Message, error) {
	msg := Message{Source: sourceKafka, ItemID: r.itemID(), Headers: map[string]string{}}
	if k := string(r.key); storableText(k) {
		msg.GroupID = k
	}
	f := wireFields{attrs: map[string]attribute{}, body: r.value, kind: "header",
		fallbacks: []fallbackID{{fmt.Sprintf("kafka://%s/%d/%d", r.topic, r.partition, r.offset), IDFromKafka, "topic/partition/offset"}}}
	for _, h := range r.headers {
		f.attrs[h.key] = stringAttr(string(h.value))
	}
	if len(r.headers) == 0 {
		f.hint = ": the record has no headers (a record not published by sluice?)"
	}
	if err := f.fill(&msg); err != nil {
		return Message{}, err
	}
	return msg, nil
}

// delivery turns the record into a delivery, ordered by its topic-partition.
func (r kafkaRecord) delivery() delivery {
	d := delivery{source: sourceKafka, id: r.itemID(), orderingGroup: r.topicPartition(),
		system: semconv.MessagingSystemKafka, destination: r.topic,
		attrs:      []otelattr.KeyValue{semconv.MessagingDestinationPartitionID(strconv.FormatInt(r.partition, 10)), semconv.MessagingKafkaOffset(int(r.offset))},
		sourceName: r.topic, position: strconv.FormatInt(r.partition, 10) + "@" + strconv.FormatInt(r.offset, 10)}
	msg, err := r.message()
	if err != nil {
		d.err = fmt.Errorf("parse record %s: %w", d.id, err)
		d.raw = r.value
		return d
	}
	d.msg = msg
	return d
}

// ParseKafka turns a record of Lambda's Kafka event into a Message: the value (base64 in the
// event) is the payload, and the headers carry the contract's attributes as the relay writes
// them (outbox.KafkaPublisher). Every error wraps [ErrBadMessage].
func ParseKafka(r events.KafkaRecord) (Message, error) {
	kr, err := fromLambdaKafka(r)
	if err != nil {
		return Message{}, err
	}
	return kr.message()
}

func fromLambdaKafka(r events.KafkaRecord) (kafkaRecord, error) {
	kr := kafkaRecord{topic: r.Topic, partition: r.Partition, offset: r.Offset}
	var err error
	if kr.value, err = base64.StdEncoding.DecodeString(r.Value); err != nil {
		return kr, badMessage("record value is not base64: %v", err)
	}
	if r.Key != "" {
		if kr.key, err = base64.StdEncoding.DecodeString(r.Key); err != nil {
			return kr, badMessage("record key is not base64: %v", err)
		}
	}
	for _, h := range r.Headers {
		for _, k := range slices.Sorted(maps.Keys(h)) { // one key per map in Lambda's events
			kr.headers = append(kr.headers, kafkaHeader{key: k, value: h[k]})
		}
	}
	return kr, nil
}

// lambdaKafkaDelivery turns a record of Lambda's event under records key tp into a delivery.
func lambdaKafkaDelivery(tp string, r events.KafkaRecord) delivery {
	kr, err := fromLambdaKafka(r)
	if err != nil {
		id := tp + "@" + strconv.FormatInt(r.Offset, 10)
		return delivery{source: sourceKafka, id: id, orderingGroup: tp, system: semconv.MessagingSystemKafka,
			destination: r.Topic, err: fmt.Errorf("parse record %s: %w", id, err)}
	}
	d := kr.delivery()
	d.orderingGroup = tp // the mapping's own name of the partition
	return d
}
