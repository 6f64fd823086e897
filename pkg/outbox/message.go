package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/sluicehq/sluice/internal/wire"
)

// snsMaxAttributes is SNS's limit of message attributes per message; maxWriteAttributes is the
// most Write lets a message carry: SNS's limit less the one the claim check adds
// (ExtendedPayloadSize) when it stores the payload in S3, as AWS's extended clients reserve it
// (their MAX_ALLOWED_ATTRIBUTES = 10 - 1), so that an offloaded message never loses a header.
// attributesBeforeHeaders is the most attributes a message carries before its headers: the
// five contract attributes and ExtendedPayloadSize.
const (
	snsMaxAttributes        = 10
	maxWriteAttributes      = snsMaxAttributes - 1
	attributesBeforeHeaders = 6
)

// reservedAttributes are the contract's attributes; headers may not reuse their names.
var reservedAttributes = []string{wire.MessageID, wire.EventType, wire.AggregateType, wire.AggregateID, wire.CreatedAt}

// claimCheckAttributes mark a message whose payload is in S3 (the extended clients' names,
// current and legacy); a header may not use them, or consumers would take its message for a
// pointer.
var claimCheckAttributes = []string{wire.ExtendedPayloadSize, wire.LegacyPayloadSize}

// Message is one event to write to the outbox.
type Message struct {
	// EventID is the message id on the wire and every consumer's dedup key.
	// Defaults to a new time-ordered UUID (version 7).
	EventID uuid.UUID
	// Topic is the logical topic, mapped to a destination (an SNS topic, an EventBridge bus, a
	// Kinesis stream, a Kafka topic) by RelayConfig.Topics. Required.
	Topic string
	// AggregateType and AggregateID say what produced the event, e.g. "order" and "o-42".
	AggregateType string
	AggregateID   string
	// EventType names the event, e.g. "OrderCreated". Required.
	EventType string
	// PartitionKey orders events: those with the same key are published in write order, and it is
	// the FIFO MessageGroupId. Defaults to AggregateID.
	PartitionKey string
	// Payload is the event body, a JSON document. It is stored in the json column as given and
	// published byte for byte: whitespace, key order, duplicate keys and the spelling of
	// numbers are kept. Write refuses what PostgreSQL's json input refuses, and arrays and
	// objects nested deeper than 1,000 levels (which some servers and consumers cannot parse),
	// and counts these bytes in the message size, and returns the messages with Payload
	// unchanged. Required.
	Payload json.RawMessage
	// Headers are carried with the message (W3C traceparent, ...): as SNS message attributes, in
	// the EventBridge and Kinesis envelopes, as Kafka record headers. Whatever the destination,
	// Write allows at most as many as the 9 attributes it allows (SNS's limit of 10 less the one
	// a claim-checked message needs) leave after the contract's attributes (5, or 3 when
	// AggregateType and AggregateID are empty), so at most 4 (or 6). Write refuses more rather
	// than drop any.
	Headers map[string]string
}

// ValidationError reports a message the writer refused, naming the field.
type ValidationError struct {
	// Index is the message's position in the Write call.
	Index int
	// Field is the offending field, e.g. "Payload" or "Headers[traceparent]".
	Field string
	// Problem says what is wrong with it.
	Problem string
}

// Error names the message, the field and the problem.
func (e *ValidationError) Error() string {
	return fmt.Sprintf("outbox message %d: %s: %s", e.Index, e.Field, e.Problem)
}

// ErrInvalidMessage matches every *ValidationError with errors.Is.
var ErrInvalidMessage = errors.New("invalid outbox message")

// Is lets errors.Is(err, ErrInvalidMessage) match.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidMessage }

// attrName reports whether name is what SNS accepts as a message attribute name's
// characters: 1 to 256 letters, digits, '_', '-' and '.'.
func attrName(name string) bool {
	if len(name) == 0 || len(name) > 256 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// checkHeaderName returns why SNS would refuse name as an attribute name, or "".
func checkHeaderName(name string) string {
	switch {
	case !attrName(name):
		return "must be 1-256 characters of letters, digits, '-', '_' and '.'"
	case strings.HasPrefix(name, ".") || strings.HasSuffix(name, "."):
		return "must not start or end with '.'"
	case strings.Contains(name, ".."):
		return "must not contain '..'"
	case strings.HasPrefix(strings.ToLower(name), "aws.") || strings.HasPrefix(strings.ToLower(name), "amazon."):
		return "the prefixes AWS. and Amazon. are reserved by AWS"
	}
	for _, r := range reservedAttributes {
		if strings.EqualFold(name, r) {
			return "is a sluice contract attribute and cannot be set as a header"
		}
	}
	for _, r := range claimCheckAttributes {
		if strings.EqualFold(name, r) {
			return "is the claim check's attribute (a payload stored in S3) and cannot be set as a header"
		}
	}
	return ""
}

// checkAttrValue returns why SNS would refuse v as a string attribute value, or "".
func checkAttrValue(v string) string {
	if v == "" {
		return "must not be empty"
	}
	if !utf8.ValidString(v) {
		return "must be valid UTF-8"
	}
	for _, r := range v {
		// The XML character range SNS accepts.
		if !(r == 0x9 || r == 0xA || r == 0xD || (r >= 0x20 && r <= 0xD7FF) || (r >= 0xE000 && r <= 0xFFFD) || (r >= 0x10000 && r <= 0x10FFFF)) {
			return fmt.Sprintf("contains the character %U, which SNS refuses", r)
		}
	}
	return ""
}

// contractAttributes counts the contract's attributes m will carry: messageId, eventType and
// createdAt always, aggregateType and aggregateId when set.
func contractAttributes(m Message) int {
	n := 3
	if m.AggregateType != "" {
		n++
	}
	if m.AggregateID != "" {
		n++
	}
	return n
}

// prepare validates m, fills its defaults, and returns the completed copy; the payload is left
// as given.
func (m Message) prepare(i int, maxPayload int) (Message, error) {
	fail := func(field, problem string) (Message, error) {
		return Message{}, &ValidationError{Index: i, Field: field, Problem: problem}
	}
	if strings.TrimSpace(m.Topic) == "" {
		return fail("Topic", "is required")
	}
	if strings.TrimSpace(m.EventType) == "" {
		return fail("EventType", "is required")
	}
	for _, f := range []struct{ field, v string }{{"Topic", m.Topic}, {"EventType", m.EventType},
		{"AggregateType", m.AggregateType}, {"AggregateID", m.AggregateID}, {"PartitionKey", m.PartitionKey}} {
		if f.v != "" {
			if p := checkAttrValue(f.v); p != "" {
				return fail(f.field, p)
			}
		}
	}
	if len(m.Payload) == 0 {
		return fail("Payload", "is required (use {} for an empty event)")
	}
	// What is checked is what is published: the bytes given.
	if len(m.Payload) > maxPayload {
		return fail("Payload", fmt.Sprintf("is %d bytes, above the publishable %d bytes%s", len(m.Payload), maxPayload, raiseHint(maxPayload)))
	}
	if p := checkPayload(m.Payload); p != "" {
		return fail("Payload", p)
	}
	if n := contractAttributes(m) + len(m.Headers); n > maxWriteAttributes {
		return fail("Headers", fmt.Sprintf("%d headers and %d contract attributes make %d message attributes, above the %d Write allows "+
			"(SNS's %d less one kept for the claim check's %s)", len(m.Headers), contractAttributes(m), n, maxWriteAttributes, snsMaxAttributes, wire.ExtendedPayloadSize))
	}
	for _, k := range sortedKeys(m.Headers) {
		if p := checkHeaderName(k); p != "" {
			return fail("Headers["+k+"]", "name "+p)
		}
		if strings.EqualFold(k, wire.Tenant) {
			return fail("Headers["+k+"]", "name is the tenant header a fleet relay sets (pkg/fleet) and cannot be written")
		}
		if p := checkAttrValue(m.Headers[k]); p != "" {
			return fail("Headers["+k+"]", "value "+p)
		}
	}
	if m.EventID == uuid.Nil {
		id, err := uuid.NewV7()
		if err != nil {
			return Message{}, fmt.Errorf("generate event id: %w", err)
		}
		m.EventID = id
	}
	if m.PartitionKey == "" {
		m.PartitionKey = m.AggregateID
	}
	return m, nil
}

// Event is an outbox row as the relay reads and publishes it.
type Event struct {
	// ID is the row's sequence number; it orders a partition key.
	ID            int64
	EventID       uuid.UUID
	Topic         string
	AggregateType string
	AggregateID   string
	EventType     string
	PartitionKey  string
	// Payload is the stored payload's bytes, the message body.
	Payload   []byte
	Headers   map[string]string
	CreatedAt time.Time
	// Attempts counts earlier failed publish attempts.
	Attempts int
	// ExtendedPayloadSize is set when the claim check stored the payload in S3: the stored
	// payload's size in bytes, published as the ExtendedPayloadSize attribute, while Payload
	// holds the pointer to it. 0 otherwise.
	ExtendedPayloadSize int
}
