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

// Names of the message attributes sluice's relay publishes (see the contract, "The message on
// the wire"). Every other string attribute is a header.
const (
	AttrMessageID     = wire.MessageID
	AttrEventType     = wire.EventType
	AttrAggregateType = wire.AggregateType
	AttrAggregateID   = wire.AggregateID
	AttrCreatedAt     = wire.CreatedAt
	// AttrTraceparent is the W3C trace context header, carried as an attribute.
	AttrTraceparent = wire.Traceparent
)

// IDSource tells where a message's dedup key came from.
type IDSource string

// The dedup key sources, in the contract's fallback order.
const (
	// IDFromAttribute: the messageId attribute (the outbox event_id). The normal case.
	IDFromAttribute IDSource = "attribute"
	// IDFromSNS: the SNS envelope's MessageId; the messageId attribute was absent.
	IDFromSNS IDSource = "sns"
	// IDFromSQS: the SQS messageId; the attribute and the envelope were absent. A message sent
	// twice to the queue gets two SQS ids, so dedup is weaker.
	IDFromSQS IDSource = "sqs"
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
	// Headers holds every other string attribute, e.g. "traceparent". Never nil.
	Headers map[string]string
	// Payload is the message body: the event JSON as the producer wrote it.
	// In the asynchronous mode it is PostgreSQL's jsonb rendering of it (same value, normalised spacing and key order).
	// For a claim-checked message the Consumer puts the payload fetched from S3 here before
	// the handler runs (Parse alone leaves the pointer).
	Payload json.RawMessage
	// Offloaded is set when the payload was stored in S3 by a claim check (sluice's relay or an
	// AWS extended client): where, and its declared size. nil otherwise, and for messages a
	// [Processor] applies (their payload was fetched when they were stored).
	Offloaded *Offloaded

	// SQSMessageID is the SQS message id, the identifier reported in BatchItemFailures.
	// Empty for messages applied by a [Processor].
	SQSMessageID string
	// GroupID is the FIFO MessageGroupId; empty for standard queues.
	GroupID string
	// ReceiveCount is SQS's ApproximateReceiveCount (1 on the first delivery); 0 when unknown.
	ReceiveCount int
	// Enveloped reports whether the message arrived inside an SNS envelope (raw delivery off).
	Enveloped bool
	// TopicARN is the SNS topic of an enveloped message.
	TopicARN string
}

// Traceparent returns the W3C traceparent header, or "".
func (m Message) Traceparent() string { return m.Headers[AttrTraceparent] }

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

// attribute is one message attribute, from either delivery form.
type attribute struct {
	dataType string
	value    *string // nil: not a string attribute
	text     string  // the value as sent, whatever its type (a Number's digits)
}

func badMessage(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadMessage, fmt.Sprintf(format, args...))
}

// Parse turns an SQS record into a Message. It accepts raw delivery and the SNS JSON envelope,
// which it recognises by a body of the form {"Type":"Notification","TopicArn":...} on a record
// without SQS message attributes. Every error wraps [ErrBadMessage] and names the problem.
// Parse never panics and does no I/O; the consumer logs when the dedup key fell back.
func Parse(record events.SQSMessage) (Message, error) {
	msg := Message{
		SQSMessageID: record.MessageId,
		GroupID:      record.Attributes["MessageGroupId"],
		Headers:      map[string]string{},
	}
	if n, err := strconv.Atoi(record.Attributes["ApproximateReceiveCount"]); err == nil {
		msg.ReceiveCount = n
	}

	var (
		attrs   = map[string]attribute{}
		body    = []byte(record.Body)
		snsID   string
		isEnvel bool
	)
	if len(record.MessageAttributes) == 0 {
		var probe struct {
			Type     string `json:"Type"`
			TopicArn string `json:"TopicArn"`
		}
		if json.Unmarshal(body, &probe) == nil && probe.Type == "Notification" && probe.TopicArn != "" {
			isEnvel = true
		}
	}
	if isEnvel {
		var env snsEnvelope
		if err := json.Unmarshal(body, &env); err != nil {
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
			attrs[name] = at
		}
		body = []byte(*env.Message)
		snsID = env.MessageID
		msg.Enveloped, msg.TopicARN = true, env.TopicArn
	} else {
		for name, a := range record.MessageAttributes {
			at := attribute{dataType: a.DataType, text: aws.ToString(a.StringValue)}
			if strings.HasPrefix(a.DataType, "String") && a.StringValue != nil {
				at.value = a.StringValue
			}
			attrs[name] = at
		}
	}

	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return Message{}, badMessage("empty body")
	}
	if !json.Valid(body) {
		return Message{}, badMessage("body is not JSON (%d bytes)", len(body))
	}
	msg.Payload = json.RawMessage(body)
	// Claim check: a pointer to the payload in S3, which the Consumer fetches (claimcheck.go).
	off, perr := offloadedFrom(attrs, body)
	if perr != nil {
		return Message{}, perr
	}
	msg.Offloaded = off

	str := func(name string) (string, bool, error) {
		a, ok := attrs[name]
		if !ok {
			return "", false, nil
		}
		if a.value == nil {
			return "", true, badMessage("attribute %s has type %q, want String", name, a.dataType)
		}
		if !storableText(*a.value) {
			return "", true, badMessage("attribute %s is not valid UTF-8 text", name)
		}
		return *a.value, true, nil
	}

	var err error
	var ok bool
	if msg.EventType, ok, err = str(AttrEventType); err != nil {
		return Message{}, err
	} else if !ok {
		if !isEnvel && len(record.MessageAttributes) == 0 {
			return Message{}, badMessage("missing attribute %s: the record has no message attributes (raw delivery of a message not published by sluice?)", AttrEventType)
		}
		return Message{}, badMessage("missing attribute %s", AttrEventType)
	} else if strings.TrimSpace(msg.EventType) == "" {
		return Message{}, badMessage("attribute %s is empty", AttrEventType)
	}

	id, ok, err := str(AttrMessageID)
	switch {
	case err != nil:
		return Message{}, err
	case ok && strings.TrimSpace(id) == "":
		return Message{}, badMessage("attribute %s is empty", AttrMessageID)
	case ok:
		msg.ID, msg.IDSource = id, IDFromAttribute
	case snsID != "":
		msg.ID, msg.IDSource = snsID, IDFromSNS
	case record.MessageId != "":
		msg.ID, msg.IDSource = record.MessageId, IDFromSQS
	default:
		return Message{}, badMessage("no dedup key: no %s attribute, SNS MessageId or SQS messageId", AttrMessageID)
	}

	if msg.AggregateType, _, err = str(AttrAggregateType); err != nil {
		return Message{}, err
	}
	if msg.AggregateID, _, err = str(AttrAggregateID); err != nil {
		return Message{}, err
	}
	created, ok, err := str(AttrCreatedAt)
	if err != nil {
		return Message{}, err
	}
	if ok {
		t, perr := time.Parse(time.RFC3339Nano, created)
		if perr != nil {
			return Message{}, badMessage("attribute %s is not an RFC 3339 time: %q", AttrCreatedAt, truncate(created, 64))
		}
		msg.CreatedAt = t.UTC()
	}

	for name, a := range attrs {
		switch name {
		case AttrMessageID, AttrEventType, AttrAggregateType, AttrAggregateID, AttrCreatedAt, wire.ExtendedPayloadSize, wire.LegacyPayloadSize:
			continue
		}
		if a.value != nil && storableText(name) && storableText(*a.value) {
			msg.Headers[name] = *a.value
		}
	}
	return msg, nil
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
