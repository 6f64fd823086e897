package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aws/aws-lambda-go/events"
	otelattr "go.opentelemetry.io/otel/attribute"
)

// Every event source (SQS, Kinesis, Kafka from Lambda, Kafka from a franz-go client) turns its
// records into deliveries and hands them to Consumer.run, the one path they share: the dedup
// key's fallback is logged, the batch runs in the configured mode with the same transaction and
// inbox rules, spans end, failures are logged, metrics are emitted. What differs per source is
// only how a record becomes a delivery (its id for failure reports, its ordering group, the
// parsed Message) and how the Report becomes the source's partial batch response.

// delivery is one record of a batch, as every source gives it to the common path.
type delivery struct {
	// source is the event source that delivered the record.
	source string
	// id identifies the record to its source in failure reports and logs (Message.ItemID).
	id string
	// orderingGroup is the record's ordering group within the batch: a failure fails every
	// later record of the group (ErrGroupBlocked). The FIFO MessageGroupId, the Kinesis shard,
	// the Kafka topic-partition; "" for none (a standard SQS queue).
	orderingGroup string
	// msg is the parsed message; zero when err is set.
	msg Message
	// err is why the record could not be parsed.
	err error
	// system, destination and xray describe the delivery to its consumer span: the messaging
	// system, the queue, stream or topic name, and an X-Ray trace header ("" for none).
	system      otelattr.KeyValue
	destination string
	xray        string
	// attrs are the delivery's own span attributes (a Kafka record's partition and offset).
	attrs []otelattr.KeyValue
	// sourceName and position are the record's source coordinates in a dead letter: the queue
	// ARN and SQS message id, the stream ARN and SHARD/SEQUENCE, the topic and PARTITION@OFFSET.
	sourceName, position string
	// receiveCount is SQS's ApproximateReceiveCount; 0 when the source gives none.
	receiveCount int
	// raw is the record's body, kept in its dead letter when it could not be parsed.
	raw []byte
	// selfManaged: ConsumeKafka delivered it and decides itself when it gives up (markDead).
	selfManaged bool
}

// ErrUnknownEventSource is returned by HandleEvent for an event it does not recognise.
var ErrUnknownEventSource = errors.New("inbox: not an SQS, Kinesis or Kafka event")

// HandleEvent is the Lambda handler for any of the event sources a Consumer reads: it
// recognises an SQS, Kinesis or Kafka (Amazon MSK, self-managed Apache Kafka) event by its
// eventSource and answers with that source's partial batch response, as HandleSQS, HandleKinesis
// and HandleKafka do. One binary then serves whichever event source mapping invokes it:
//
//	lambda.StartWithOptions(consumer.HandleEvent, lambda.WithEnableSIGTERM(pool.Close))
//
// An event it does not recognise is an error (ErrUnknownEventSource): nothing was applied, and
// the invocation fails. An empty batch answers no failures.
func (c *Consumer) HandleEvent(ctx context.Context, event json.RawMessage) (any, error) {
	var top map[string]json.RawMessage // exact keys: Kafka's "records" is not SQS's "Records"
	if err := json.Unmarshal(event, &top); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnknownEventSource, err)
	}
	var source string
	_ = json.Unmarshal(top["eventSource"], &source)
	switch source {
	case "aws:kafka", "SelfManagedKafka", "aws:SelfManagedKafka":
		var ev events.KafkaEvent
		if err := json.Unmarshal(event, &ev); err != nil {
			return nil, fmt.Errorf("%w: Kafka event: %v", ErrUnknownEventSource, err)
		}
		return c.HandleKafka(ctx, ev)
	}
	var records []struct {
		EventSource string `json:"eventSource"`
	}
	if raw, ok := top["Records"]; !ok || json.Unmarshal(raw, &records) != nil {
		return nil, fmt.Errorf("%w: no eventSource or Records", ErrUnknownEventSource)
	}
	if len(records) == 0 {
		return events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{}}, nil
	}
	switch records[0].EventSource {
	case sourceSQS:
		var ev events.SQSEvent
		if err := json.Unmarshal(event, &ev); err != nil {
			return nil, fmt.Errorf("%w: SQS event: %v", ErrUnknownEventSource, err)
		}
		return c.HandleSQS(ctx, ev)
	case sourceKinesis:
		var ev events.KinesisEvent
		if err := json.Unmarshal(event, &ev); err != nil {
			return nil, fmt.Errorf("%w: Kinesis event: %v", ErrUnknownEventSource, err)
		}
		return c.HandleKinesis(ctx, ev)
	}
	return nil, fmt.Errorf("%w: records from %q", ErrUnknownEventSource, records[0].EventSource)
}

// IsScheduledEvent reports whether event is an EventBridge schedule's ("Scheduled Event" from
// aws.events), the event a function that is both a Consumer and a Processor gets from its
// processor schedule, as opposed to an event source's batch (see HandleEvent).
func IsScheduledEvent(event json.RawMessage) bool {
	var scheduled struct {
		Source     string `json:"source"`
		DetailType string `json:"detail-type"`
	}
	return json.Unmarshal(event, &scheduled) == nil && scheduled.Source == "aws.events" && scheduled.DetailType == "Scheduled Event"
}

// run applies a batch of deliveries, in their order, and reports each one's outcome: the path
// every source shares (see the comment at the top of this file). An empty batch is a no-op.
func (c *Consumer) run(ctx context.Context, ds []delivery) Report {
	b := &batch{c: c, results: make([]Result, len(ds)), blocked: map[string]bool{}}
	if len(ds) == 0 {
		return Report{Results: b.results}
	}
	b.recs = make([]record, len(ds))
	for i, d := range ds {
		b.results[i] = Result{ItemID: d.id, Outcome: Failed}
		if d.source == sourceSQS {
			b.results[i].SQSMessageID = d.id
		}
		if d.err == nil && d.msg.IDSource != IDFromAttribute {
			c.log.WarnContext(ctx, "inbox: messageId attribute absent, dedup key falls back",
				"source", string(d.msg.IDSource), "message_id", d.msg.ID, "item_id", d.id, "event_type", d.msg.EventType)
		}
		if d.err == nil {
			b.results[i].MessageID, b.results[i].EventType, b.results[i].Tenant = d.msg.ID, d.msg.EventType, d.msg.Tenant()
		}
		b.recs[i] = record{i: i, delivery: d}
	}
	// Claim check: fetch the payloads stored in S3 before any transaction opens (claimcheck.go).
	b.fetchPayloads(ctx)

	if c.tenants != nil {
		b.runTenants(ctx) // each tenant's records apply in its database (tenants.go)
	} else {
		b.apply(ctx)
	}

	rep := Report{Results: b.results}
	for _, res := range rep.Results {
		if res.Outcome == Failed {
			c.log.WarnContext(ctx, "inbox: record failed", "item_id", res.ItemID,
				"message_id", res.MessageID, "event_type", res.EventType, "tenant", res.Tenant, "class", errorClass(res.Err), "error", res.Err.Error())
			var pe *PanicError
			if errors.As(res.Err, &pe) {
				c.log.ErrorContext(ctx, "inbox: handler panicked", "message_id", res.MessageID, "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
			}
		}
	}
	c.emit(ctx, rep, b.recs)
	return rep
}

// apply runs the batch in the configured mode on the Consumer's database, ends its spans and
// records its dead letters.
func (b *batch) apply(ctx context.Context) {
	switch b.c.cfg.Mode {
	case Batched:
		b.runBatched(ctx)
	default:
		b.runPerRecord(ctx)
	}
	b.endSpans(ctx)
	b.recordFailures(ctx)
}
