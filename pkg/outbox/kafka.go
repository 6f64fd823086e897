package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/wire"
)

// KafkaProducer is the one franz-go call a KafkaPublisher makes: *kgo.Client has it, and a
// wrapping client may stand in.
type KafkaProducer interface {
	ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults
}

var _ KafkaProducer = (*kgo.Client)(nil)

// KafkaPublisher produces events to Kafka topics (Amazon MSK or any cluster) with franz-go: the
// record key is the row's partition key, so a key stays on one partition, the value is the
// payload as published to SNS, and the contract's attributes and the headers are record
// headers. The client should keep franz-go's defaults of an idempotent producer with acks=all
// (NewKafkaClient does): an event is acknowledged when every in-sync replica has it. The relay
// sends a key's next rows only after its previous ones were acknowledged, several of them in one
// call (Limits), so a key's records are in id order on its partition (docs/destinations.md).
type KafkaPublisher struct {
	client     KafkaProducer
	maxMessage int
}

// NewKafkaPublisher returns a Publisher over a franz-go client; maxMessageBytes is the largest
// record value and headers the brokers accept (0 for MessageLimits.Kafka's default).
func NewKafkaPublisher(client KafkaProducer, maxMessageBytes int) *KafkaPublisher {
	if maxMessageBytes <= 0 {
		maxMessageBytes = settingDefault("MessageLimits.Kafka")
	}
	return &KafkaPublisher{client: client, maxMessage: maxMessageBytes}
}

var (
	_ LimitedPublisher   = (*KafkaPublisher)(nil)
	_ DestinationChecker = (*KafkaPublisher)(nil)
)

// MessageSize implements LimitedPublisher: the batch of the one record (key, value, headers
// and their framing), as the brokers' message.max.bytes and franz-go's ProducerBatchMaxBytes
// count it.
func (p *KafkaPublisher) MessageSize(_ string, e *Event, payloadLen int) int {
	return messageSize(Kafka, e, payloadLen, "")
}

// Limits implements LimitedPublisher: up to 500 records a call, several of one key among them
// (KeyOrderInCall). A key's records go to one partition, in the order they are produced, and
// with the idempotent producer a failure of a buffered record fails every later buffered
// record of its partition (franz-go's RecordRetries: "This ensures gapless ordering: the client
// will not fail one record only to produce a later one successfully"). Records that fail
// before they are buffered fail alone: PublishBatch keeps every record within the size the
// brokers take (a larger one is failed before the call, with the records of its key after it),
// and the relay checks each call's answer for a later record of a key acknowledged after an
// earlier one failed (Stats.OrderViolations).
func (p *KafkaPublisher) Limits(string) Limits {
	return Limits{MaxEntries: 500, MaxMessageBytes: p.maxMessage, MaxCallBytes: 64 << 20, KeyOrderInCall: true}
}

// CheckDestination implements DestinationChecker: dest must be kafka://TOPIC.
func (p *KafkaPublisher) CheckDestination(dest string) error {
	if d, err := ParseDestination(dest); err != nil || d.Kind != Kafka {
		return fmt.Errorf("destination %q is not a Kafka topic (kafka://NAME)", dest)
	}
	return nil
}

// kafkaRecord returns the record that carries e to topic.
func kafkaRecord(topic string, e *Event) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(e.PartitionKey), Value: e.Payload, Headers: kafkaHeaders(e), Timestamp: e.CreatedAt}
}

// kafkaHeaders returns the record headers of e: the contract's attributes, the claim check's
// size, and every valid header.
func kafkaHeaders(e *Event) []kgo.RecordHeader {
	headers := []kgo.RecordHeader{
		{Key: wire.MessageID, Value: []byte(e.EventID.String())},
		{Key: wire.EventType, Value: []byte(e.EventType)},
		{Key: wire.CreatedAt, Value: []byte(e.CreatedAt.UTC().Format(time.RFC3339Nano))},
	}
	if e.AggregateType != "" {
		headers = append(headers, kgo.RecordHeader{Key: wire.AggregateType, Value: []byte(e.AggregateType)})
	}
	if e.AggregateID != "" {
		headers = append(headers, kgo.RecordHeader{Key: wire.AggregateID, Value: []byte(e.AggregateID)})
	}
	if e.ExtendedPayloadSize > 0 {
		headers = append(headers, kgo.RecordHeader{Key: wire.ExtendedPayloadSize, Value: []byte(strconv.Itoa(e.ExtendedPayloadSize))})
	}
	for _, k := range headerOrder(e.Headers) {
		if checkHeaderName(k) == "" && checkAttrValue(e.Headers[k]) == "" {
			headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(e.Headers[k])})
		}
	}
	return headers
}

// permanentKafkaErrors are broker answers that producing the same record again cannot fix.
var permanentKafkaErrors = []error{
	kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTopicException, kerr.InvalidRecord,
	kerr.CorruptMessage, kerr.InvalidRequiredAcks, kerr.UnsupportedForMessageFormat, kerr.UnsupportedCompressionType,
}

// PublishBatch implements Publisher: one ProduceSync of every event, in order, each
// acknowledged (or not) on its own.
func (p *KafkaPublisher) PublishBatch(ctx context.Context, dest string, events []*Event) []error {
	d, err := ParseDestination(dest)
	if err != nil || d.Kind != Kafka {
		return CallFailed(len(events), Permanent(fmt.Errorf("destination %q is not a Kafka topic (kafka://NAME)", dest)))
	}
	errs := make([]error, len(events))
	var (
		records []*kgo.Record
		index   []int
	)
	// refused: keys with a record failed here, before producing. Their later records in the
	// call are not produced either (a record that fails before it is buffered fails alone, and
	// would let the next one of its key overtake it).
	var refused map[string]error
	for i, e := range events {
		if err := refused[e.PartitionKey]; err != nil {
			errs[i] = fmt.Errorf("kafka: event %s not produced: an earlier record of its key in the call failed: %w", e.EventID, err)
			continue
		}
		if n := p.MessageSize(dest, e, len(e.Payload)); n > p.maxMessage {
			errs[i] = Permanent(fmt.Errorf("kafka: event %s is %d bytes as a record, above the %d the brokers take", e.EventID, n, p.maxMessage))
			if refused == nil {
				refused = map[string]error{}
			}
			refused[e.PartitionKey] = errs[i]
			continue
		}
		records, index = append(records, kafkaRecord(d.Name, e)), append(index, i)
	}
	if len(records) == 0 {
		return errs
	}
	// An idempotent producer never fails a record whose request was sent (it cannot know
	// whether the broker wrote it), so ProduceSync may outlast the call's deadline while a broker
	// refuses: the call ends at the deadline, and records franz-go still holds may be delivered
	// later (duplicates, never reordered: the relay retries a key's row before its next one).
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- p.client.ProduceSync(ctx, records...) }()
	var results kgo.ProduceResults
	select {
	case results = <-done:
	case <-ctx.Done():
		for _, i := range index {
			errs[i] = fmt.Errorf("kafka produce to %s: %w", d.Name, ctx.Err())
		}
		return errs
	}
	byRecord := make(map[*kgo.Record]error, len(results))
	for _, r := range results {
		byRecord[r.Record] = r.Err
	}
	for j, rec := range records {
		err, ok := byRecord[rec]
		if !ok {
			err = errors.New("kafka produce: record missing from the results")
		}
		if err != nil {
			err = fmt.Errorf("kafka produce to %s: %w", d.Name, err)
			for _, perm := range permanentKafkaErrors {
				if errors.Is(err, perm) {
					err = Permanent(err)
					break
				}
			}
		}
		errs[index[j]] = err
	}
	return errs
}
