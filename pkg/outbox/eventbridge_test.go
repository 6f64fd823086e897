package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// busWithQueue creates an event bus, a queue and a rule on the bus that sends every event of
// source sluice to the queue, through the standard AWS APIs only: the endpoint is moto_server
// (which delivers to SQS targets) or LocalStack, never fauxqs, which has no EventBridge
// (localaws.TestEndpointServing).
func busWithQueue(t *testing.T) (busARN, queueURL string, eb *eventbridge.Client, sq *sqs.Client) {
	t.Helper()
	ctx := context.Background()
	cfg := localaws.TestConfigServing(t, localaws.ServiceEventBridge, localaws.ServiceSQS)
	eb, sq = eventbridge.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	name := "outbox-test-" + uuid.NewString()[:8]
	bus, err := eb.CreateEventBus(ctx, &eventbridge.CreateEventBusInput{Name: aws.String(name)})
	require.NoError(t, err)
	queue, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	require.NoError(t, err)
	qa, err := sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: queue.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	require.NoError(t, err)
	_, err = eb.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String(name), EventBusName: aws.String(name),
		EventPattern: aws.String(`{"source":["` + outbox.DefaultEventSource + `"]}`)})
	require.NoError(t, err)
	_, err = eb.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String(name), EventBusName: aws.String(name),
		Targets: []ebtypes.Target{{Id: aws.String("queue"), Arn: aws.String(qa.Attributes["QueueArn"])}}})
	require.NoError(t, err)
	return aws.ToString(bus.EventBusArn), aws.ToString(queue.QueueUrl), eb, sq
}

// eventBridgeEvent is an event as an EventBridge rule delivers it to an SQS target.
type eventBridgeEvent struct {
	DetailType string        `json:"detail-type"`
	Source     string        `json:"source"`
	Detail     wire.Envelope `json:"detail"`
}

// Every row reaches the rule's queue once, as the documented envelope: detail-type is the
// event type, source the configured one, detail.metadata the contract's attributes and
// detail.data the payload.
func TestEventBridgePublisherDeliversTheEnvelope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	busARN, queueURL, eb, sq := busWithQueue(t)

	const n = 23 // more than two PutEvents calls' worth
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{
			Topic: testTopic, AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "OrderCreated",
			PartitionKey: fmt.Sprintf("k%d", i%5), Payload: json.RawMessage(fmt.Sprintf(`{"seq": %d, "note": "héllo"}`, i)),
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		}
	}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := outbox.Write(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewEventBridgePublisher(eb, "")
		c.Topics = map[string]string{testTopic: busARN}
		c.PublishTimeout = 20 * time.Second // moto answers slowly on a busy machine: a timeout would send duplicates
	})
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })

	byID := map[string]outbox.Message{}
	for _, w := range written {
		byID[w.EventID.String()] = w
	}
	// The relay publishes at least once (a slow answer may be retried), so a copy is possible:
	// each event arrives, every copy carries the same envelope.
	seen := map[string]bool{}
	for _, m := range receiveDistinct(t, sq, queueURL, n, eventBridgeMessageID) {
		var ev eventBridgeEvent
		require.NoError(t, json.Unmarshal([]byte(aws.ToString(m.Body)), &ev), "body: %s", aws.ToString(m.Body))
		md := ev.Detail.Metadata
		w, ok := byID[md.MessageID]
		require.True(t, ok, "detail.metadata.messageId %q is a written event id", md.MessageID)
		seen[md.MessageID] = true
		require.Equal(t, "OrderCreated", ev.DetailType)
		require.Equal(t, outbox.DefaultEventSource, ev.Source)
		require.Equal(t, "OrderCreated", md.EventType)
		require.Equal(t, "order", md.AggregateType)
		require.Equal(t, w.AggregateID, md.AggregateID)
		require.Equal(t, w.PartitionKey, md.PartitionKey)
		created, err := time.Parse(time.RFC3339Nano, md.CreatedAt)
		require.NoError(t, err, "createdAt is RFC 3339")
		require.WithinDuration(t, time.Now(), created, time.Hour)
		require.Equal(t, w.Headers, md.Headers)
		require.JSONEq(t, string(w.Payload), string(ev.Detail.Data), "detail.data is the payload")
	}
	require.Len(t, seen, n)
}

// eventBridgeMessageID returns the message id of an EventBridge event delivered to a queue.
func eventBridgeMessageID(m sqstypes.Message) string {
	var ev eventBridgeEvent
	if json.Unmarshal([]byte(aws.ToString(m.Body)), &ev) != nil {
		return aws.ToString(m.MessageId)
	}
	return ev.Detail.Metadata.MessageID
}

// faultyBus forwards PutEvents to a real endpoint but answers chosen entries itself with a
// per-entry error, in the same response as the entries the endpoint accepted. A stub for this
// case only: moto rejects single entries only for a missing source, detail-type or detail, or
// detail that is not JSON, none of which the publisher sends (the schema forbids an empty
// event_type), and LocalStack is no different.
type faultyBus struct {
	next interface {
		PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, opts ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
	}
	mu sync.Mutex
	// codes are the error codes to answer per message id, one per attempt; "" forwards.
	codes map[string][]string
}

func (f *faultyBus) take(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	codes := f.codes[id]
	if len(codes) == 0 {
		return ""
	}
	f.codes[id] = codes[1:]
	return codes[0]
}

func (f *faultyBus) PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, opts ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error) {
	out := &eventbridge.PutEventsOutput{Entries: make([]ebtypes.PutEventsResultEntry, len(in.Entries))}
	var forward []ebtypes.PutEventsRequestEntry
	var index []int
	for i, e := range in.Entries {
		var env wire.Envelope
		if err := json.Unmarshal([]byte(aws.ToString(e.Detail)), &env); err != nil {
			return nil, err
		}
		if code := f.take(env.Metadata.MessageID); code != "" {
			out.Entries[i] = ebtypes.PutEventsResultEntry{ErrorCode: aws.String(code), ErrorMessage: aws.String("injected by the test")}
			out.FailedEntryCount++
			continue
		}
		forward, index = append(forward, e), append(index, i)
	}
	if len(forward) > 0 {
		res, err := f.next.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: forward}, opts...)
		if err != nil {
			return nil, err
		}
		for j, r := range res.Entries {
			out.Entries[index[j]] = r
		}
		out.FailedEntryCount += res.FailedEntryCount
	}
	return out, nil
}

// Per-entry failures are handled like SNS's: an entry EventBridge rejects as malformed is
// quarantined alone while the rest of its call is delivered; a throttled entry is retried and
// delivered; the rows of a topic mapped to a bus that does not exist (the endpoint refuses the
// whole call) are quarantined, not retried for ever, and block no other topic.
func TestEventBridgePublisherQuarantinesWhatTheBusRefusesAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	busARN, queueURL, eb, sq := busWithQueue(t)
	missingARN := busARN[:strings.LastIndex(busARN, "/")+1] + "does-not-exist-" + uuid.NewString()[:8]

	written := b.write(t, 8, 4) // keys k0..k3, two rows each
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	ghosts, err := outbox.Write(ctx, tx,
		outbox.Message{Topic: "ghost", EventType: "OrderCreated", PartitionKey: "g0", Payload: json.RawMessage(`{}`)},
		outbox.Message{Topic: "ghost", EventType: "OrderCreated", PartitionKey: "g1", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	malformed, throttled := written[1], written[2] // keys k1 and k2, each the first of its key
	pub := &faultyBus{next: eb, codes: map[string][]string{
		malformed.EventID.String(): {"MalformedDetail"},
		throttled.EventID.String(): {"ThrottlingException"},
	}}

	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewEventBridgePublisher(pub, "")
		c.Topics = map[string]string{testTopic: busARN, "ghost": missingARN}
		c.PublishTimeout = 20 * time.Second // moto answers slowly on a busy machine
	})
	// Everything settles but k1's second row, which waits behind the quarantined first.
	drainUntil(t, r, func() bool {
		return b.countWhere(t, "published_at IS NULL AND quarantined_at IS NULL AND partition_key <> 'k1'") == 0 &&
			b.countWhere(t, "quarantined_at IS NOT NULL") == 3
	})

	require.Equal(t, 1, b.countWhere(t, fmt.Sprintf("quarantined_at IS NOT NULL AND event_id = '%s' AND last_error LIKE '%%MalformedDetail%%'", malformed.EventID)),
		"the malformed entry is quarantined with EventBridge's reason")
	require.Equal(t, 1, b.countWhere(t, fmt.Sprintf("published_at IS NOT NULL AND event_id = '%s' AND attempts = 1", throttled.EventID)),
		"the throttled entry failed once, then was delivered")
	require.Equal(t, 2, b.countWhere(t, "quarantined_at IS NOT NULL AND topic = 'ghost' AND last_error LIKE '%ResourceNotFound%'"),
		"a missing bus is permanent")
	require.Equal(t, len(ghosts)+1, b.countWhere(t, "quarantined_at IS NOT NULL"))

	// The malformed row blocks only its own key: k1's second row waits behind it.
	require.Equal(t, 1, b.countWhere(t, "published_at IS NULL AND quarantined_at IS NULL AND partition_key = 'k1'"),
		"a quarantined row blocks its key")
	got := map[string]bool{}
	for _, m := range receiveDistinct(t, sq, queueURL, len(written)-2, eventBridgeMessageID) {
		var ev eventBridgeEvent
		require.NoError(t, json.Unmarshal([]byte(aws.ToString(m.Body)), &ev))
		got[ev.Detail.Metadata.MessageID] = true
	}
	require.True(t, got[throttled.EventID.String()])
	require.False(t, got[malformed.EventID.String()])
}
