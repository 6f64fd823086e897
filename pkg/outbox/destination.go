package outbox

import (
	"context"
	"fmt"
	"strings"
)

// Kind is the broker a destination belongs to, told by the destination's form (ParseDestination).
type Kind string

// The destinations the relay can publish to. Which ordering and deduplication each gives
// downstream: docs/destinations.md.
const (
	// SNS: an SNS topic ARN, arn:aws:sns:REGION:ACCOUNT:NAME (".fifo" for a FIFO topic).
	SNS Kind = "sns"
	// EventBridge: an event bus ARN, arn:aws:events:REGION:ACCOUNT:event-bus/NAME.
	EventBridge Kind = "eventbridge"
	// Kinesis: a data stream ARN, arn:aws:kinesis:REGION:ACCOUNT:stream/NAME.
	Kinesis Kind = "kinesis"
	// Kafka: a Kafka topic, kafka://NAME (Amazon MSK or any Kafka cluster the relay's Kafka
	// client reaches).
	Kafka Kind = "kafka"
)

// Destination is a parsed destination: its kind and the name its broker calls it by (an SNS
// topic ARN, an EventBridge bus ARN, a Kinesis stream ARN, or a Kafka topic name).
type Destination struct {
	Kind Kind
	Name string
}

// kafkaScheme prefixes Kafka destinations.
const kafkaScheme = "kafka://"

// ParseDestination tells which broker dest names. It returns an error naming the problem
// for anything else.
func ParseDestination(dest string) (Destination, error) {
	if name, ok := strings.CutPrefix(dest, kafkaScheme); ok {
		if name == "" || strings.ContainsAny(name, "/ ") || len(name) > 249 {
			return Destination{}, fmt.Errorf("destination %q: a Kafka topic name is 1 to 249 characters without '/' or spaces", dest)
		}
		return Destination{Kind: Kafka, Name: name}, nil
	}
	parts := strings.SplitN(dest, ":", 6)
	if len(parts) != 6 || parts[0] != "arn" || parts[5] == "" {
		return Destination{}, fmt.Errorf("destination %q is neither an ARN (SNS topic, EventBridge bus, Kinesis stream) nor kafka://TOPIC", dest)
	}
	resource := parts[5]
	switch parts[2] {
	case "sns":
		return Destination{Kind: SNS, Name: dest}, nil
	case "events":
		if !strings.HasPrefix(resource, "event-bus/") {
			return Destination{}, fmt.Errorf("destination %q: an EventBridge destination is an event bus ARN (...:event-bus/NAME)", dest)
		}
		return Destination{Kind: EventBridge, Name: dest}, nil
	case "kinesis":
		if !strings.HasPrefix(resource, "stream/") {
			return Destination{}, fmt.Errorf("destination %q: a Kinesis destination is a stream ARN (...:stream/NAME)", dest)
		}
		return Destination{Kind: Kinesis, Name: dest}, nil
	}
	return Destination{}, fmt.Errorf("destination %q: service %q is not a destination (want sns, events or kinesis, or kafka://TOPIC)", dest, parts[2])
}

// Limits are what a destination accepts: in one message (payload and attributes) and in one
// publish call.
type Limits struct {
	// MaxEntries is the most events one call carries.
	MaxEntries int
	// MaxMessageBytes is the largest message; a larger row is quarantined (or, with a claim
	// check, its payload is stored in S3).
	MaxMessageBytes int
	// MaxCallBytes is the most bytes one call carries, all its messages together.
	MaxCallBytes int
	// KeyOrderInCall: the destination stores the entries of one partition key that share a
	// call in the call's order, and when it fails one of them it fails every later one of
	// that key in the call too. Only then does the relay put several consecutive rows of a key
	// in one call (at most the rows a round takes of a key, MaxPerKey); it acknowledges them
	// up to the first failure, and counts a later one acknowledged after a failure as a broken
	// promise (Stats.OrderViolations). Without it (the default) a call carries one row per
	// key. The Kafka publisher sets it; the SNS, EventBridge and Kinesis publishers do not
	// (docs/destinations.md says why for each).
	KeyOrderInCall bool
}

// snsLimits are SNS's: PublishBatch takes 10 entries and 256 KiB in all.
var snsLimits = Limits{MaxEntries: maxBatchEntries, MaxMessageBytes: settingDefault("MessageLimits.SNS"), MaxCallBytes: settingDefault("MessageLimits.SNS")}

// LimitedPublisher is a Publisher that knows what its destinations accept: their limits, and a
// message's size as the destination counts it (with the publisher's own settings, such as
// EventBridge's Source). The relay asks it for each destination, and compares each message's
// size with the destination's limit and the claim check's threshold. A Publisher that is not
// one gets SNS's limits, and its messages are measured as the destination's kind counts them.
// The built-in publishers (SNS, EventBridge, Kinesis, Kafka) are LimitedPublishers; a wrapping
// one can delegate to them.
type LimitedPublisher interface {
	Publisher
	Limits(destination string) Limits
	// MessageSize returns the size destination counts for e's message when its payload is
	// payloadLen bytes (e.Payload is not read).
	MessageSize(destination string, e *Event, payloadLen int) int
}

// DestinationChecker is a Publisher that can tell, when the relay starts, whether it can
// publish to a destination at all; NewRelay refuses a configuration it cannot serve.
type DestinationChecker interface {
	CheckDestination(destination string) error
}

// Publishers routes each call to the publisher of its destination's kind (ParseDestination),
// so that each logical topic may live on a different broker. Leave nil the kinds not used.
type Publishers struct {
	SNS, EventBridge, Kinesis, Kafka Publisher
}

var (
	_ LimitedPublisher   = Publishers{}
	_ DestinationChecker = Publishers{}
)

func (p Publishers) of(dest string) (Publisher, error) {
	d, err := ParseDestination(dest)
	if err != nil {
		return nil, err
	}
	var pub Publisher
	switch d.Kind {
	case SNS:
		pub = p.SNS
	case EventBridge:
		pub = p.EventBridge
	case Kinesis:
		pub = p.Kinesis
	case Kafka:
		pub = p.Kafka
	}
	if pub == nil {
		return nil, fmt.Errorf("destination %s: no %s publisher is configured", dest, d.Kind)
	}
	return pub, nil
}

// PublishBatch implements Publisher. A destination it has no publisher for fails permanently.
func (p Publishers) PublishBatch(ctx context.Context, dest string, events []*Event) []error {
	pub, err := p.of(dest)
	if err != nil {
		return CallFailed(len(events), Permanent(err))
	}
	return pub.PublishBatch(ctx, dest, events)
}

// Limits implements LimitedPublisher.
func (p Publishers) Limits(dest string) Limits {
	pub, err := p.of(dest)
	if err != nil {
		return snsLimits
	}
	return limitsOf(pub, dest)
}

// MessageSize implements LimitedPublisher: the measure of dest's publisher.
func (p Publishers) MessageSize(dest string, e *Event, payloadLen int) int {
	pub, err := p.of(dest)
	if err != nil {
		return messageSize(SNS, e, payloadLen, "")
	}
	return measure(pub, dest, e, payloadLen)
}

// measure returns the size dest counts for e: pub's own measure when it has one
// (LimitedPublisher), messageSize of dest's kind otherwise.
func measure(pub Publisher, dest string, e *Event, payloadLen int) int {
	if m, ok := pub.(LimitedPublisher); ok {
		return m.MessageSize(dest, e, payloadLen)
	}
	kind := SNS
	if d, err := ParseDestination(dest); err == nil {
		kind = d.Kind
	}
	return messageSize(kind, e, payloadLen, "")
}

// CheckDestination implements DestinationChecker.
func (p Publishers) CheckDestination(dest string) error {
	pub, err := p.of(dest)
	if err != nil {
		return err
	}
	if c, ok := pub.(DestinationChecker); ok {
		return c.CheckDestination(dest)
	}
	return nil
}

// limitsOf returns pub's limits for dest: its own when it knows them, SNS's otherwise.
func limitsOf(pub Publisher, dest string) Limits {
	if l, ok := pub.(LimitedPublisher); ok {
		lim := l.Limits(dest)
		if lim.MaxEntries > 0 && lim.MaxMessageBytes > 0 && lim.MaxCallBytes > 0 {
			return lim
		}
	}
	return snsLimits
}
