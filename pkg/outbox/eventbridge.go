package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/smithy-go"
)

// EventBridgeAPI is the one EventBridge call an EventBridgePublisher makes: *eventbridge.Client
// has it, and a wrapping client may stand in.
type EventBridgeAPI interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, opts ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

var _ EventBridgeAPI = (*eventbridge.Client)(nil)

// DefaultEventSource is EventBridgePublisher's default Source.
const DefaultEventSource = "sluice"

// eventBridgeLimits are PutEvents': 10 entries, each less than 256 KB (the relay's limit is
// MessageLimits.EventBridge), and 256 KiB in all.
var eventBridgeLimits = Limits{MaxEntries: 10, MaxMessageBytes: int(RelaySetting("MessageLimits.EventBridge").Max), MaxCallBytes: 256 * 1024}

// EventBridgePublisher publishes events to EventBridge buses with PutEvents: DetailType is
// the event type, Source the configured one, Time the row's created_at, and Detail the
// envelope {"metadata": {messageId, eventType, ...}, "data": payload} (wire.Envelope), so
// rules match the payload under detail.data. EventBridge neither orders nor deduplicates:
// consumers deduplicate on detail.metadata.messageId (docs/destinations.md).
type EventBridgePublisher struct {
	client EventBridgeAPI
	source string
}

// NewEventBridgePublisher returns a Publisher over an EventBridge client; source is the
// events' Source ("" for DefaultEventSource).
func NewEventBridgePublisher(client EventBridgeAPI, source string) *EventBridgePublisher {
	if source == "" {
		source = DefaultEventSource
	}
	return &EventBridgePublisher{client: client, source: source}
}

var (
	_ LimitedPublisher   = (*EventBridgePublisher)(nil)
	_ DestinationChecker = (*EventBridgePublisher)(nil)
)

// MessageSize implements LimitedPublisher: the PutEvents entry as EventBridge counts it
// (Time's 14 bytes, Source, DetailType and the envelope as Detail).
func (p *EventBridgePublisher) MessageSize(_ string, e *Event, payloadLen int) int {
	return messageSize(EventBridge, e, payloadLen, p.source)
}

// Limits implements LimitedPublisher.
func (p *EventBridgePublisher) Limits(string) Limits { return eventBridgeLimits }

// CheckDestination implements DestinationChecker: dest must be an event bus ARN.
func (p *EventBridgePublisher) CheckDestination(dest string) error {
	if d, err := ParseDestination(dest); err != nil || d.Kind != EventBridge {
		return fmt.Errorf("destination %q is not an EventBridge bus ARN (arn:aws:events:REGION:ACCOUNT:event-bus/NAME)", dest)
	}
	return nil
}

// permanentEventBridgeCodes are error codes that retrying the same entry cannot fix.
var permanentEventBridgeCodes = map[string]bool{
	"MalformedDetail": true, "InvalidArgument": true, "ValidationException": true,
	"ResourceNotFoundException": true, "InvalidEventPatternException": true,
}

// PublishBatch implements Publisher. Entries go out in as few PutEvents calls as the
// request limit allows.
func (p *EventBridgePublisher) PublishBatch(ctx context.Context, bus string, events []*Event) []error {
	errs := make([]error, len(events))
	var (
		entries []ebtypes.PutEventsRequestEntry
		index   []int
		size    int
	)
	flush := func() {
		if len(entries) == 0 {
			return
		}
		for j, err := range p.put(ctx, entries) {
			errs[index[j]] = err
		}
		entries, index, size = nil, nil, 0
	}
	for i, e := range events {
		detail, err := envelopeOf(e)
		if err != nil {
			errs[i] = Permanent(fmt.Errorf("eventbridge: envelope of event %s: %w", e.EventID, err))
			continue
		}
		entry := ebtypes.PutEventsRequestEntry{
			EventBusName: aws.String(bus), Source: aws.String(p.source), DetailType: aws.String(e.EventType),
			Detail: aws.String(string(detail)), Time: aws.Time(e.CreatedAt),
		}
		n := p.MessageSize(bus, e, len(e.Payload)) // EventBridge's entry size
		if n > eventBridgeLimits.MaxMessageBytes {
			errs[i] = Permanent(fmt.Errorf("eventbridge: event %s is %d bytes as an entry, above PutEvents' %d", e.EventID, n, eventBridgeLimits.MaxMessageBytes))
			continue
		}
		if size+n > eventBridgeLimits.MaxCallBytes || len(entries) == eventBridgeLimits.MaxEntries {
			flush()
		}
		entries, index, size = append(entries, entry), append(index, i), size+n
	}
	flush()
	return errs
}

func (p *EventBridgePublisher) put(ctx context.Context, entries []ebtypes.PutEventsRequestEntry) []error {
	out, err := p.client.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: entries})
	if err != nil {
		err = fmt.Errorf("eventbridge put events: %w", err)
		var apiErr smithy.APIError
		if errors.As(err, &apiErr) && permanentEventBridgeCodes[apiErr.ErrorCode()] {
			err = Permanent(err)
		}
		return CallFailed(len(entries), err)
	}
	errs := make([]error, len(entries))
	for i := range entries {
		if i >= len(out.Entries) {
			errs[i] = errors.New("eventbridge put events: entry missing from the response")
			continue
		}
		r := out.Entries[i]
		if code := aws.ToString(r.ErrorCode); code != "" {
			err := fmt.Errorf("eventbridge rejected entry: %s: %s", code, aws.ToString(r.ErrorMessage))
			if permanentEventBridgeCodes[code] || strings.HasPrefix(code, "Malformed") {
				err = Permanent(err)
			}
			errs[i] = err
		}
	}
	return errs
}
