package inbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/sluicehq/sluice/internal/wire"
)

// IDSource tells where a message's dedup key came from.
type IDSource string

// The dedup key sources. The messageId attribute (an SQS or SNS message attribute, a Kafka
// header, or the messageId of an envelope's metadata) is the normal case; the others are the
// documented fallbacks of each delivery form, used only when it is absent (and logged).
const (
	// IDFromAttribute: the messageId attribute (the outbox event_id). The normal case.
	IDFromAttribute IDSource = "attribute"
	// IDFromSNS: the SNS envelope's MessageId; the messageId attribute was absent.
	IDFromSNS IDSource = "sns"
	// IDFromEventBridge: the id of the EventBridge event an EventBridge rule delivered to SQS;
	// the envelope's messageId was absent. EventBridge keeps the id across its delivery retries.
	IDFromEventBridge IDSource = "eventbridge"
	// IDFromSQS: the SQS messageId; the attribute and the envelope were absent. A message sent
	// twice to the queue gets two SQS ids, so dedup is weaker.
	IDFromSQS IDSource = "sqs"
	// IDFromKafka: the record's place, kafka://TOPIC/PARTITION/OFFSET; the messageId header was
	// absent. Redeliveries of the record dedup; the same event produced twice does not, and a
	// topic deleted and created again reuses offsets, so its new records would be taken for
	// duplicates of the old ones. Publish with sluice (or set the header) to avoid both.
	IDFromKafka IDSource = "kafka"
	// IDFromKinesis: the record's place, STREAM_ARN/SHARD_ID/SEQUENCE_NUMBER; the envelope's
	// messageId was absent. Redeliveries dedup; the same event put twice does not.
	IDFromKinesis IDSource = "kinesis"
)

// The values of Message.Source: the event sources a Consumer reads.
const (
	sourceSQS     = "aws:sqs"
	sourceKinesis = "aws:kinesis"
	sourceKafka   = "kafka" // Amazon MSK, self-managed Kafka, or a franz-go client (ConsumeKafka)
	sourceInbox   = "inbox" // a stored row the Processor applies (a dead letter's source)
)

// Message is one parsed delivery.
type Message struct {
	// ID is the dedup key: the messageId attribute (the outbox event_id) unless IDSource says otherwise.
	ID string
	// IDSource tells where ID came from.
	IDSource IDSource
	// EventType routes the message, e.g. "OrderCreated". Never empty.
	EventType string
	// AggregateType and AggregateID name what produced the event; empty when the attributes were absent.
	AggregateType string
	AggregateID   string
	// CreatedAt is the producer's createdAt attribute (the outbox row's commit-side time);
	// zero when absent.
	CreatedAt time.Time
	// Headers holds every other string attribute, e.g. "traceparent". Never nil. A claim check's
	// size (wire.ExtendedPayloadSize) is here for Kafka records and the Kinesis envelope (an SQS
	// message carries it as an attribute of its own).
	Headers map[string]string
	// Payload is the message body: the event JSON byte for byte as the producer wrote it, in
	// every mode (the asynchronous inbox stores it in a json column, which keeps the bytes).
	// For a claim-checked message the Consumer puts the payload fetched from S3 here before
	// the handler runs (Parse alone leaves the pointer).
	Payload json.RawMessage
	// Offloaded is set when the payload was stored in S3 by a claim check (sluice's relay or an
	// AWS extended client): where, and its declared size. nil otherwise, and for messages a
	// [Processor] applies (their payload was fetched when they were stored).
	Offloaded *Offloaded

	// Source is the event source that delivered the message, as the Lambda event's records
	// name it: "aws:sqs" (SQS), "aws:kinesis" (Kinesis), or "kafka" (Amazon MSK, self-managed
	// Kafka, or ConsumeKafka). Empty for messages applied by a [Processor].
	Source string
	// ItemID identifies the delivery to its source, as batch item failures and logs name it: the
	// SQS message id, the Kinesis sequence number, or TOPIC-PARTITION@OFFSET for Kafka. Empty
	// for messages applied by a [Processor].
	ItemID string
	// SQSMessageID is the SQS message id, the identifier reported in BatchItemFailures.
	// Empty for other sources and for messages applied by a [Processor].
	SQSMessageID string
	// GroupID is the ordering key: the SQS FIFO MessageGroupId, or the partition key (the Kafka
	// record key, the envelope's partitionKey) for Kafka and Kinesis; empty for standard queues.
	// The asynchronous mode applies a group's messages in order.
	GroupID string
	// ReceiveCount is SQS's ApproximateReceiveCount (1 on the first delivery); 0 when unknown
	// (always for Kafka and Kinesis).
	ReceiveCount int
	// Enveloped reports whether the message arrived inside an SNS envelope (raw delivery off).
	Enveloped bool
	// TopicARN is the SNS topic of an enveloped message.
	TopicARN string
}

// Traceparent returns the W3C traceparent header, or "".
func (m Message) Traceparent() string { return m.Headers[wire.Traceparent] }

// Decode unmarshals the payload into v.
func (m Message) Decode(v any) error {
	if err := json.Unmarshal(m.Payload, v); err != nil {
		return fmt.Errorf("decode %s payload of message %s: %w", m.EventType, m.ID, err)
	}
	return nil
}

// Decode unmarshals the message's payload into a new T:
//
//	order, err := inbox.Decode[OrderCreated](msg)
func Decode[T any](m Message) (T, error) {
	var v T
	err := m.Decode(&v)
	return v, err
}

// snsEnvelope is the JSON body SNS delivers to SQS when raw message delivery is off.
type snsEnvelope struct {
	Type              string             `json:"Type"`
	MessageID         string             `json:"MessageId"`
	TopicArn          string             `json:"TopicArn"`
	Message           *string            `json:"Message"`
	MessageAttributes map[string]snsAttr `json:"MessageAttributes"`
}

type snsAttr struct {
	Type  string `json:"Type"`
	Value string `json:"Value"`
}

// eventBridgeEvent is the JSON body an EventBridge rule with an SQS target delivers: the event,
// whose detail the relay wrote as a wire.Envelope.
type eventBridgeEvent struct {
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Detail     json.RawMessage `json:"detail"`
}

// bodyProbe recognises an SQS body that wraps the message: an SNS notification or an EventBridge event.
type bodyProbe struct {
	Type       string          `json:"Type"`
	TopicArn   string          `json:"TopicArn"`
	DetailType *string         `json:"detail-type"`
	Source     *string         `json:"source"`
	Detail     json.RawMessage `json:"detail"`
}

func (p bodyProbe) sns() bool { return p.Type == "Notification" && p.TopicArn != "" }
func (p bodyProbe) eventBridge() bool {
	return p.DetailType != nil && p.Source != nil && len(p.Detail) > 0
}

// attribute is one message attribute, from any delivery form.
type attribute struct {
	dataType string
	value    *string // nil: not a string attribute
	text     string  // the value as sent, whatever its type (a Number's digits)
}

func stringAttr(v string) attribute { return attribute{dataType: "String", value: &v, text: v} }

func badMessage(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadMessage, fmt.Sprintf(format, args...))
}

// fallbackID is a dedup key to use when the messageId attribute is absent; name says what it is
// in the error when every one is empty.
type fallbackID struct {
	id     string
	source IDSource
	name   string
}

// wireFields is one delivery's contract attributes and body before they are checked, whichever
// form they travelled in: SQS message attributes, an SNS envelope's attributes, Kafka record
// headers, or an envelope's metadata (EventBridge detail, Kinesis data). fill checks them the
// same way for every form.
type wireFields struct {
	attrs map[string]attribute
	body  []byte
	// kind names an attribute in errors: "attribute", "header" or "metadata field".
	kind string
	// fallbacks are the dedup keys to try, in order, when the messageId attribute is absent.
	fallbacks []fallbackID
	// hint explains a missing eventType when the delivery had no attributes at all.
	hint string
}

// Parse turns an SQS record into a Message. It accepts raw delivery, the SNS JSON envelope, which
// it recognises by a body of the form {"Type":"Notification","TopicArn":...} on a record without
// SQS message attributes, and an EventBridge event delivered by a rule with an SQS target (a body
// with detail-type, source and detail, the detail being the relay's envelope, wire.Envelope).
// Every error wraps [ErrBadMessage] and names the problem. Parse never panics and does no I/O;
// the consumer logs when the dedup key fell back.
func Parse(record events.SQSMessage) (Message, error) {
	msg := Message{
		Source:       sourceSQS,
		ItemID:       record.MessageId,
		SQSMessageID: record.MessageId,
		GroupID:      record.Attributes["MessageGroupId"],
		Headers:      map[string]string{},
	}
	if n, err := strconv.Atoi(record.Attributes["ApproximateReceiveCount"]); err == nil {
		msg.ReceiveCount = n
	}
	sqsID := fallbackID{record.MessageId, IDFromSQS, "SQS messageId"}
	f := wireFields{attrs: map[string]attribute{}, body: []byte(record.Body), kind: "attribute", fallbacks: []fallbackID{sqsID}}

	var probe bodyProbe
	if len(record.MessageAttributes) == 0 && json.Unmarshal(f.body, &probe) != nil {
		probe = bodyProbe{}
	}
	switch {
	case len(record.MessageAttributes) == 0 && probe.sns():
		var env snsEnvelope
		if err := json.Unmarshal(f.body, &env); err != nil {
			return Message{}, badMessage("SNS envelope: %v", err)
		}
		if env.Message == nil {
			return Message{}, badMessage("SNS envelope has no Message")
		}
		for name, a := range env.MessageAttributes {
			at := attribute{dataType: a.Type, text: a.Value}
			if strings.HasPrefix(a.Type, "String") && a.Type != "String.Array" {
				v := a.Value
				at.value = &v
			}
			f.attrs[name] = at
		}
		f.body = []byte(*env.Message)
		f.fallbacks = []fallbackID{{env.MessageID, IDFromSNS, "SNS MessageId"}, sqsID}
		msg.Enveloped, msg.TopicARN = true, env.TopicArn
	case len(record.MessageAttributes) == 0 && probe.eventBridge():
		var ev eventBridgeEvent
		if err := json.Unmarshal(f.body, &ev); err != nil {
			return Message{}, badMessage("EventBridge event: %v", err)
		}
		// The partition key is not a group here: EventBridge does not keep a key's order.
		env, _, err := envelopeFields(ev.Detail, "EventBridge event detail")
		if err != nil {
			return Message{}, err
		}
		f = env
		f.fallbacks = []fallbackID{{ev.ID, IDFromEventBridge, "EventBridge event id"}, sqsID}
	default:
		for name, a := range record.MessageAttributes {
			at := attribute{dataType: a.DataType, text: aws.ToString(a.StringValue)}
			if strings.HasPrefix(a.DataType, "String") && a.StringValue != nil {
				at.value = a.StringValue
			}
			f.attrs[name] = at
		}
		if len(record.MessageAttributes) == 0 {
			f.hint = ": the record has no message attributes (raw delivery of a message not published by sluice?)"
		}
	}
	if err := f.fill(&msg); err != nil {
		return Message{}, err
	}
	return msg, nil
}

// envelopeMetadata reads wire.EnvelopeMetadata telling an absent field from an empty one.
type envelopeMetadata struct {
	MessageID           *string           `json:"messageId"`
	EventType           *string           `json:"eventType"`
	AggregateType       *string           `json:"aggregateType"`
	AggregateID         *string           `json:"aggregateId"`
	PartitionKey        string            `json:"partitionKey"`
	CreatedAt           *string           `json:"createdAt"`
	Headers             map[string]string `json:"headers"`
	ExtendedPayloadSize int               `json:"extendedPayloadSize"`
}

// envelopeFields reads the relay's envelope (wire.Envelope: the contract's attributes under
// "metadata", the payload under "data"), which what names in errors, and returns its fields
// and the partition key.
func envelopeFields(b []byte, what string) (wireFields, string, error) {
	var env struct {
		Metadata *envelopeMetadata `json:"metadata"`
		Data     json.RawMessage   `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return wireFields{}, "", badMessage("%s is not a sluice envelope: %v", what, err)
	}
	if env.Metadata == nil {
		return wireFields{}, "", badMessage("%s is not a sluice envelope: no metadata", what)
	}
	md := env.Metadata
	f := wireFields{attrs: map[string]attribute{}, body: env.Data, kind: "metadata field"}
	for k, v := range md.Headers {
		if !contractAttr(k) {
			f.attrs[k] = stringAttr(v)
		}
	}
	for name, v := range map[string]*string{wire.MessageID: md.MessageID, wire.EventType: md.EventType,
		wire.AggregateType: md.AggregateType, wire.AggregateID: md.AggregateID, wire.CreatedAt: md.CreatedAt} {
		if v != nil {
			f.attrs[name] = stringAttr(*v)
		}
	}
	if md.ExtendedPayloadSize > 0 {
		f.attrs[wire.ExtendedPayloadSize] = stringAttr(strconv.Itoa(md.ExtendedPayloadSize))
	}
	return f, md.PartitionKey, nil
}

// contractAttr reports whether name is one of the contract's attributes (not a header).
func contractAttr(name string) bool {
	switch name {
	case wire.MessageID, wire.EventType, wire.AggregateType, wire.AggregateID, wire.CreatedAt:
		return true
	}
	return false
}

// fill checks f and sets msg's payload, dedup key, event type, aggregate, creation time and
// headers from it. Every error wraps ErrBadMessage.
func (f wireFields) fill(msg *Message) error {
	body := bytes.TrimSpace(f.body)
	if len(body) == 0 {
		return badMessage("empty body")
	}
	if !json.Valid(body) {
		return badMessage("body is not JSON (%d bytes)", len(body))
	}
	// The payload is the body byte for byte, surrounding whitespace included (JSON allows it).
	msg.Payload = json.RawMessage(f.body)
	// Claim check: a pointer to the payload in S3, which the Consumer fetches (claimcheck.go).
	off, perr := offloadedFrom(f.attrs, body)
	if perr != nil {
		return perr
	}
	msg.Offloaded = off

	str := func(name string) (string, bool, error) {
		a, ok := f.attrs[name]
		if !ok {
			return "", false, nil
		}
		if a.value == nil {
			return "", true, badMessage("%s %s has type %q, want String", f.kind, name, a.dataType)
		}
		if !storableText(*a.value) {
			return "", true, badMessage("%s %s is not valid UTF-8 text", f.kind, name)
		}
		return *a.value, true, nil
	}

	var err error
	var ok bool
	if msg.EventType, ok, err = str(wire.EventType); err != nil {
		return err
	} else if !ok {
		return badMessage("missing %s %s%s", f.kind, wire.EventType, f.hint)
	} else if strings.TrimSpace(msg.EventType) == "" {
		return badMessage("%s %s is empty", f.kind, wire.EventType)
	}

	id, ok, err := str(wire.MessageID)
	switch {
	case err != nil:
		return err
	case ok && strings.TrimSpace(id) == "":
		return badMessage("%s %s is empty", f.kind, wire.MessageID)
	case ok:
		msg.ID, msg.IDSource = id, IDFromAttribute
	default:
		names := make([]string, 0, len(f.fallbacks))
		for _, fb := range f.fallbacks {
			if fb.id != "" && storableText(fb.id) {
				msg.ID, msg.IDSource = fb.id, fb.source
				break
			}
			names = append(names, fb.name)
		}
		if msg.ID == "" {
			return badMessage("no dedup key: no %s %s%s", wire.MessageID, f.kind, orList(names))
		}
	}

	if msg.AggregateType, _, err = str(wire.AggregateType); err != nil {
		return err
	}
	if msg.AggregateID, _, err = str(wire.AggregateID); err != nil {
		return err
	}
	created, ok, err := str(wire.CreatedAt)
	if err != nil {
		return err
	}
	if ok {
		t, perr := time.Parse(time.RFC3339Nano, created)
		if perr != nil {
			return badMessage("%s %s is not an RFC 3339 time: %q", f.kind, wire.CreatedAt, truncate(created, 64))
		}
		msg.CreatedAt = t.UTC()
	}

	for name, a := range f.attrs {
		if contractAttr(name) || name == wire.ExtendedPayloadSize || name == wire.LegacyPayloadSize {
			continue // the claim check's size is Offloaded's, not a header
		}
		if a.value != nil && storableText(name) && storableText(*a.value) {
			msg.Headers[name] = *a.value
		}
	}
	return nil
}

// orList renders ", A, B or C" (or "" for none).
func orList(names []string) string {
	switch len(names) {
	case 0:
		return ""
	case 1:
		return " or " + names[0]
	}
	return ", " + strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// storableText reports whether PostgreSQL can store s in a text column (valid UTF-8, no NUL).
func storableText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// truncate returns s as text PostgreSQL stores (see storableText), cut to at most n bytes on a
// character boundary with "..." appended when it was cut. Invalid UTF-8 and NUL bytes become
// U+FFFD, so error text from anywhere (a handler, a driver) can be written to a text column.
func truncate(s string, n int) string {
	if !storableText(s) {
		s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut-- // s[cut] continues the character that starts before it: cut before that one
	}
	return s[:cut] + "..."
}
