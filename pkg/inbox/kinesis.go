package inbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/aws/aws-lambda-go/events"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluicehq/sluice/internal/wire"
)

// messagingSystemKinesis is Kinesis's messaging.system, the relay's too (wire.MessagingSystemKinesis).
var messagingSystemKinesis = semconv.MessagingSystemKey.String(wire.MessagingSystemKinesis)

// HandleKinesis is the Lambda handler for a Kinesis Data Streams event source mapping with
// ReportBatchItemFailures:
//
//	lambda.StartWithOptions(consumer.HandleKinesis, lambda.WithEnableSIGTERM(pool.Close))
//
// Each record's data is the relay's envelope (wire.Envelope); it is applied with the same
// transaction and inbox rules as an SQS record, in the batch's order. Lambda checkpoints at the
// lowest sequence number reported failed and retries everything after it, so after a record
// fails every later record of its shard is reported failed too without being attempted
// (ErrGroupBlocked): a shard's records are applied in order, never past a failure. It never
// returns an error: failures are per record, in BatchItemFailures (see docs/inbox.md for the
// mapping's settings and what a poison record does).
func (c *Consumer) HandleKinesis(ctx context.Context, event events.KinesisEvent) (events.KinesisEventResponse, error) {
	ds := make([]delivery, len(event.Records))
	for i, r := range event.Records {
		ds[i] = kinesisDelivery(r)
	}
	rep := c.run(ctx, ds)
	resp := events.KinesisEventResponse{BatchItemFailures: []events.KinesisBatchItemFailure{}}
	for i, res := range rep.Results {
		if res.Outcome == Failed {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.KinesisBatchItemFailure{ItemIdentifier: event.Records[i].Kinesis.SequenceNumber})
		}
	}
	return resp, nil
}

// ParseKinesis turns a record of Lambda's Kinesis event into a Message: its data is the relay's
// envelope, {"metadata": {messageId, eventType, ...}, "data": payload} (wire.Envelope). Without
// metadata.messageId the dedup key is STREAM_ARN/SHARD_ID/SEQUENCE_NUMBER (IDFromKinesis). Every
// error wraps [ErrBadMessage].
func ParseKinesis(r events.KinesisEventRecord) (Message, error) {
	f, key, err := envelopeFields(r.Kinesis.Data, "Kinesis record data")
	if err != nil {
		return Message{}, err
	}
	seq := r.Kinesis.SequenceNumber
	f.fallbacks = []fallbackID{{fmt.Sprintf("%s/%s/%s", r.EventSourceArn, kinesisShard(r), seq), IDFromKinesis, "stream/shard/sequence number"}}
	if r.EventSourceArn == "" || seq == "" {
		f.fallbacks = nil // not enough to name the record
	}
	msg := Message{Source: sourceKinesis, ItemID: seq, GroupID: key, Headers: map[string]string{}}
	if msg.GroupID == "" {
		msg.GroupID = r.Kinesis.PartitionKey
	}
	if err := f.fill(&msg); err != nil {
		return Message{}, err
	}
	return msg, nil
}

// kinesisShard returns the record's shard id, the part of its eventID before the colon
// ("shardId-000000000000:4959..."), or the stream ARN when the eventID has none: then the
// whole batch is one ordering group, which is never wrong, only slower to unblock.
func kinesisShard(r events.KinesisEventRecord) string {
	if shard, _, ok := strings.Cut(r.EventID, ":"); ok && shard != "" {
		return shard
	}
	return r.EventSourceArn
}

func kinesisDelivery(r events.KinesisEventRecord) delivery {
	d := delivery{source: sourceKinesis, id: r.Kinesis.SequenceNumber, orderingGroup: kinesisShard(r),
		system: messagingSystemKinesis, destination: streamName(r.EventSourceArn),
		sourceName: r.EventSourceArn, position: kinesisShard(r) + "/" + r.Kinesis.SequenceNumber}
	msg, err := ParseKinesis(r)
	if err != nil {
		d.err = fmt.Errorf("parse record %s: %w", d.id, err)
		d.raw = r.Kinesis.Data
		return d
	}
	d.msg = msg
	return d
}

// streamName returns the stream name of a Kinesis stream ARN (arn:aws:kinesis:region:account:stream/NAME), or "".
func streamName(arn string) string {
	_, name, ok := strings.Cut(arn, ":stream/")
	if !ok {
		return ""
	}
	return name
}
