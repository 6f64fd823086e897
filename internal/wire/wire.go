// Package wire names the message attributes of sluice's wire contract, shared by the relay that
// publishes them (pkg/outbox) and the consumers that read them (pkg/inbox).
package wire

import "encoding/json"

// String message attributes carried on every published message.
const (
	// MessageID is the outbox event_id: the consumers' dedup key and the FIFO deduplication id.
	MessageID = "messageId"
	// EventType is the event's type, e.g. OrderCreated.
	EventType = "eventType"
	// AggregateType and AggregateID say what produced the event.
	AggregateType = "aggregateType"
	AggregateID   = "aggregateId"
	// CreatedAt is the outbox row's created_at, RFC 3339 in UTC.
	CreatedAt = "createdAt"
	// Traceparent is the W3C trace context header, carried as an attribute when the producer set it.
	Traceparent = "traceparent"
	// Tracestate is the W3C trace state header.
	Tracestate = "tracestate"
	// Tenant names the tenant database a fleet relay published the message from (pkg/fleet),
	// carried as a header; absent when the relay serves one database.
	Tenant = "sluiceTenant"
)

// The claim check's pointer, in the format of AWS's extended client libraries for SNS and SQS
// (payload offloading): the body is a JSON array of the pointer class and the object's place,
// and a Number attribute gives the payload's size in bytes.
const (
	// ExtendedPayloadSize is the attribute that marks a message whose payload is in S3.
	ExtendedPayloadSize = "ExtendedPayloadSize"
	// LegacyPayloadSize is the attribute older extended clients wrote instead.
	LegacyPayloadSize = "SQSLargePayloadSize"
	// PointerClass names the pointer in the body: [PointerClass, {"s3BucketName", "s3Key"}].
	PointerClass = "software.amazon.payloadoffloading.PayloadS3Pointer"
	// LegacyPointerClass is the pointer class older extended clients wrote.
	LegacyPointerClass = "com.amazon.sqs.javamessaging.MessageS3Pointer"
)

// Envelope is the JSON document that carries an event to destinations without message
// attributes: EventBridge's detail and a Kinesis record's data. The contract's attributes are
// under "metadata", the payload, as published to SNS, under "data" (a claim check's pointer
// when metadata.extendedPayloadSize is set).
type Envelope struct {
	Metadata EnvelopeMetadata `json:"metadata"`
	Data     json.RawMessage  `json:"data"`
}

// EnvelopeMetadata is an Envelope's metadata: the attributes of the wire contract.
type EnvelopeMetadata struct {
	MessageID     string            `json:"messageId"`
	EventType     string            `json:"eventType"`
	AggregateType string            `json:"aggregateType,omitempty"`
	AggregateID   string            `json:"aggregateId,omitempty"`
	PartitionKey  string            `json:"partitionKey"`
	CreatedAt     string            `json:"createdAt"`
	Headers       map[string]string `json:"headers,omitempty"`
	// ExtendedPayloadSize is set when data is a claim check's pointer: the stored payload's size.
	ExtendedPayloadSize int `json:"extendedPayloadSize,omitempty"`
}

// The messaging.system of each destination on spans, one value per destination for the relay's
// publish spans and the inbox's process spans alike. SNS, SQS and Kafka are the OpenTelemetry
// messaging conventions' well-known values (aws.sns, aws_sqs, kafka); Kinesis and EventBridge
// have none, so they follow the aws.sns form.
const (
	MessagingSystemKinesis     = "aws.kinesis"
	MessagingSystemEventBridge = "aws.eventbridge"
)

// Attributes the relay adds to its publish spans beside the messaging semantic conventions
// (docs/tracing.md).
const (
	// SpanOutboxWaitMillis is how long a row waited in the outbox before this publish call: the
	// call's start minus created_at (which PostgreSQL sets at the writing transaction's start).
	// On each link of a publish span; the span carries the largest as SpanOutboxMaxWaitMillis.
	SpanOutboxWaitMillis    = "sluice.outbox.wait_ms"
	SpanOutboxMaxWaitMillis = "sluice.outbox.max_wait_ms"
	// SpanMessageIDs lists the event ids of a publish call.
	SpanMessageIDs = "sluice.message_ids"
	// SpanPublishFailed counts the entries of a publish call the broker did not acknowledge.
	SpanPublishFailed = "sluice.publish.failed"
)
