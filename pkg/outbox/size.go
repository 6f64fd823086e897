package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
)

// What each destination accepts in one message is a setting (MessageLimits, RelaySettings'
// MessageLimits.* entries, which cite AWS's documentation); these bound what Write lets through.
const (
	// minMessageLimitBytes is the smallest message limit a destination may be given: room for
	// the most a message carries beside its payload (maxMessageOverheadBytes) and a claim
	// check's pointer, so that offloading the payload always makes a message fit.
	minMessageLimitBytes = 32 << 10
	// maxMessageOverheadBytes is the most Write lets a message carry beside its payload (its
	// attributes or envelope metadata, headers and partition key, as the strictest destination
	// counts them): 16 KiB.
	maxMessageOverheadBytes = 16 << 10

	// eventBridgeDeliveryOverhead bounds what an EventBridge event adds to its entry when a rule
	// delivers it whole to an SQS queue: version, id, account, time, region, resources and the
	// JSON keys around detail-type, source and detail (about 170 bytes; Time's 14 are counted).
	eventBridgeDeliveryOverhead = 256
	// eventBridgeMaxSource is the longest Source EventBridge accepts: Write measures with it,
	// since the Source is the relay's setting.
	eventBridgeMaxSource = 256
	// maxCreatedAtLen is the longest createdAt (RFC 3339 with nanoseconds, UTC).
	maxCreatedAtLen = len("2006-01-02T15:04:05.999999999Z")
	// kafkaRecordOverhead bounds what a one-record batch adds to the record's key, value and
	// header bytes: the batch header (61 bytes), the record's length, attributes, timestamp and
	// offset deltas and key and value lengths (varints), and the header count.
	kafkaRecordOverhead = 61 + 5 + 1 + 10 + 5 + 5 + 5 + 5
	// kafkaHeaderOverhead bounds a header's two length varints.
	kafkaHeaderOverhead = 10
)

// MessageLimits are the largest messages the deployment's destinations accept, each as its
// service counts it (MessageSize). The relay publishes a message inline only when it fits its
// destination's limit; above it, with a claim check, the payload goes to S3, and without one
// the row is quarantined, which Write prevents when its MaxMessageBytes is at most the
// smallest of these (see WriterConfig).
type MessageLimits struct {
	// SNS is the topics' MaximumMessageSize. Defaults to 256 KiB.
	SNS int
	// SQS is the consumer queues' MaximumMessageSize: SNS delivers raw messages (body and
	// attributes, as SNS counts them) and EventBridge whole events (the entry and about 256
	// bytes more) to queues, so it bounds both. Defaults to 256 KiB.
	SQS int
	// EventBridge is the largest PutEvents entry. Defaults to 262,143 bytes.
	EventBridge int
	// Kinesis is the streams' maximum record size. Defaults to 1 MiB.
	Kinesis int
	// Kafka is the largest record batch the brokers take (message.max.bytes), which the
	// producer's ProducerBatchMaxBytes must equal. Defaults to 1,000,000 bytes.
	Kafka int
}

// WithDefaults returns l with every zero field set to its default.
func (l MessageLimits) WithDefaults() MessageLimits {
	return RelayConfig{MessageLimits: l}.WithDefaults().MessageLimits
}

// Check reports every field of l (after WithDefaults) outside what its service allows.
func (l MessageLimits) Check() error {
	c := RelayConfig{MessageLimits: l.WithDefaults()}
	var errs []error
	for _, s := range relaySettings {
		if strings.HasPrefix(s.Field, "MessageLimits.") {
			errs = append(errs, s.Check(s.Get(c)))
		}
	}
	return errors.Join(errs...)
}

// Of returns the largest message the relay publishes inline to a destination of kind k: the
// service's own limit, and for SNS and EventBridge also what their queues accept (Kinesis and
// Kafka consumers read the stream or topic itself).
func (l MessageLimits) Of(k Kind) int {
	l = l.WithDefaults()
	switch k {
	case EventBridge:
		return min(l.EventBridge, l.SQS-eventBridgeDeliveryOverhead)
	case Kinesis:
		return l.Kinesis
	case Kafka:
		return l.Kafka
	}
	return min(l.SNS, l.SQS)
}

// Smallest returns the smallest of l's limits over every kind: the most WriterConfig's
// MaxMessageBytes may be for a deployment without a claim check.
func (l MessageLimits) Smallest() int {
	n := l.Of(SNS)
	for _, k := range []Kind{EventBridge, Kinesis, Kafka} {
		n = min(n, l.Of(k))
	}
	return n
}

// messageSize returns the size a destination of kind k counts for e's message when its payload
// is payloadLen bytes: SNS (and SQS) the body and each attribute's name, type and value;
// EventBridge the entry (Time's 14 bytes, Source, DetailType and the envelope as Detail);
// Kinesis the envelope and the partition key; Kafka the record batch of the one record (key,
// value, headers and their framing). source is the EventBridge Source ("" for
// DefaultEventSource). e.Payload is not read: the size of each is its payload's length plus
// what surrounds it, which does not depend on the payload's bytes.
func messageSize(k Kind, e *Event, payloadLen int, source string) int {
	switch k {
	case EventBridge:
		if source == "" {
			source = DefaultEventSource
		}
		return 14 + len(source) + len(e.EventType) + envelopeSize(e, payloadLen)
	case Kinesis:
		return envelopeSize(e, payloadLen) + len(streamKey(e.PartitionKey))
	case Kafka:
		n := kafkaRecordOverhead + len(e.PartitionKey) + payloadLen
		for _, h := range kafkaHeaders(e) {
			n += kafkaHeaderOverhead + len(h.Key) + len(h.Value)
		}
		return n
	}
	return payloadLen + attributesSize(e)
}

// strictestSize is the largest MessageSize of e over every kind, with the longest Source and
// createdAt: what Write compares with its maximum, since it does not know the destination.
func strictestSize(e *Event, payloadLen int) int {
	long := *e
	if long.CreatedAt.IsZero() || len(long.CreatedAt.UTC().Format(time.RFC3339Nano)) < maxCreatedAtLen {
		// A time whose RFC 3339 form is the longest: nanoseconds without trailing zeros.
		long.CreatedAt = time.Date(2006, 1, 2, 15, 4, 5, 999_999_999, time.UTC)
	}
	n := 0
	for _, k := range []Kind{SNS, EventBridge, Kinesis, Kafka} {
		n = max(n, messageSize(k, &long, payloadLen, longestSource))
	}
	return n
}

// longestSource is the longest EventBridge Source (eventBridgeMaxSource bytes), which
// strictestSize measures with.
var longestSource = strings.Repeat("s", eventBridgeMaxSource)

// The terms of overheadBound. A byte of EventType, AggregateType, AggregateID, PartitionKey or
// of a header's name or value appears at most twice in any destination's measure (EventType as
// EventBridge's DetailType and in the envelope, PartitionKey in the Kinesis envelope and as its
// stream key), each time at most 6 bytes long (JSON's \u00XX escape, the longest), so it adds
// at most 12; a header adds at most boundPerHeader beside its bytes (SNS's "String" type,
// the envelope's quotes, colon, comma and the "headers":{} around them, a Kafka header's
// varints). boundBase is the exact overhead of a message with one byte in each field and no
// headers (so that every key omitempty would drop is counted), plus a stream key's hashed
// form (sha256-<64 hex>), which replaces a partition key of more than 256 characters.
const (
	boundPerByte   = 12
	boundPerHeader = 32
)

var boundBase = func() int {
	_, overhead := writeSize(Message{EventID: uuid.Max, EventType: "e", AggregateType: "t", AggregateID: "i", PartitionKey: "k", Payload: []byte("{}")})
	return overhead + len("sha256-") + 64
}()

// overheadBound is an upper bound of what writeSize counts beside m's payload, from the
// lengths of m's fields alone: what Write checks first, so that a message far from every
// limit (nearly all of them) costs a few additions instead of rendering its envelope,
// attributes and record headers for each destination kind. Only a message whose bound
// reaches a limit is measured exactly (writeSize), which decides. m's fields are those of a
// validated message (Message.prepare): valid UTF-8, attribute names and values SNS accepts.
func overheadBound(m Message) int {
	n := boundBase + boundPerByte*(len(m.EventType)+len(m.AggregateType)+len(m.AggregateID)+len(m.PartitionKey))
	for k, v := range m.Headers {
		n += boundPerHeader + boundPerByte*(len(k)+len(v))
	}
	return n
}

// surelyFits reports whether m, measured as writeSize does, is certainly at most maxBytes with
// at most maxMessageOverheadBytes beside its payload, judged by overheadBound; false means
// writeSize must decide.
func surelyFits(m Message, maxBytes int) bool {
	b := overheadBound(m)
	return b <= maxMessageOverheadBytes && len(m.Payload)+b <= maxBytes
}

// envelopeSize is the length of e's envelope (envelopeOf) with a payload of payloadLen bytes.
func envelopeSize(e *Event, payloadLen int) int {
	meta, err := envelopeMetadata(e)
	if err != nil {
		return 1 << 62 // cannot be encoded: larger than any limit
	}
	return len(envelopeOpen) + len(meta) + len(envelopeData) + payloadLen + len(envelopeClose)
}

// The envelope around its metadata and data.
const (
	envelopeOpen  = `{"metadata":`
	envelopeData  = `,"data":`
	envelopeClose = `}`
)

// encodeJSON encodes v as json.Marshal does, but without escaping <, > and & (which would
// make the envelope's size depend on more than the lengths of its values' bytes).
func encodeJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
