package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// topicWithRawQueue creates a topic and a queue subscribed to it with raw delivery, through
// the standard AWS APIs only (so it runs on LocalStack as on fauxqs).
func topicWithRawQueue(t *testing.T, fifo bool) (topicARN, queueURL string, sqsClient *sqs.Client, snsClient *sns.Client) {
	t.Helper()
	ctx := context.Background()
	cfg := localaws.TestConfig(t)
	snsClient, sqsClient = sns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	name := "outbox-test-" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	topicAttrs, queueAttrs := map[string]string{}, map[string]string{}
	if fifo {
		name += ".fifo"
		topicAttrs["FifoTopic"] = "true"
		queueAttrs["FifoQueue"] = "true"
	}
	topic, err := snsClient.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(name), Attributes: topicAttrs})
	require.NoError(t, err)
	queue, err := sqsClient.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: queueAttrs})
	require.NoError(t, err)
	qa, err := sqsClient.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: queue.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	require.NoError(t, err)
	_, err = snsClient.Subscribe(ctx, &sns.SubscribeInput{
		TopicArn: topic.TopicArn, Protocol: aws.String("sqs"), Endpoint: aws.String(qa.Attributes["QueueArn"]),
		Attributes: map[string]string{"RawMessageDelivery": "true"},
	})
	require.NoError(t, err)
	return aws.ToString(topic.TopicArn), aws.ToString(queue.QueueUrl), sqsClient, snsClient
}

func receiveAll(t *testing.T, c *sqs.Client, url string, n int) []sqstypes.Message {
	t.Helper()
	var got []sqstypes.Message
	testwait.Progress(t, "every message received", func() (int, bool) {
		if len(got) >= n {
			return len(got), true
		}
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		require.NoError(t, err)
		for _, m := range out.Messages {
			got = append(got, m)
			_, err := c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
		return len(got), len(got) >= n
	})
	require.Len(t, got, n)
	return got
}

// receiveDistinct receives from url until n distinct messages (by id) arrived, and returns the
// first copy of each: the relay publishes at least once, so a test of what arrives must not
// count copies.
func receiveDistinct(t *testing.T, c *sqs.Client, url string, n int, id func(sqstypes.Message) string) []sqstypes.Message {
	t.Helper()
	byID := map[string]bool{}
	var got []sqstypes.Message
	testwait.Progress(t, "every distinct message received", func() (int, bool) {
		if len(got) >= n {
			return len(got), true
		}
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		require.NoError(t, err)
		for _, m := range out.Messages {
			if k := id(m); !byID[k] {
				byID[k] = true
				got = append(got, m)
			}
			_, err := c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
		return len(got), len(got) >= n
	})
	require.Len(t, got, n)
	return got
}

func TestSNSPublisherDeliversTheWireContract(t *testing.T) {
	t.Parallel()
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			topicARN, queueURL, sqsClient, snsClient := topicWithRawQueue(t, fifo)

			msgs := make([]outbox.Message, 12)
			for i := range msgs {
				msgs[i] = outbox.Message{
					Topic: testTopic, AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%2), EventType: "OrderCreated",
					Payload: json.RawMessage(fmt.Sprintf(`{"seq": %d, "note": "héllo"}`, i)),
					Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
				}
			}
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			written, err := outbox.Write(ctx, tx, msgs...)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))

			r, err := outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: outbox.NewSNSPublisher(snsClient), Topics: map[string]string{testTopic: topicARN}})
			require.NoError(t, err)
			st, err := r.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 12, st.Published)

			got := receiveAll(t, sqsClient, queueURL, 12)
			byID := map[string]outbox.Message{}
			for _, w := range written {
				byID[w.EventID.String()] = w
			}
			var order []string // FIFO: per group, the order of arrival
			for _, m := range got {
				attr := func(k string) string { return aws.ToString(m.MessageAttributes[k].StringValue) }
				w, ok := byID[attr("messageId")]
				require.True(t, ok, "messageId attribute carries the event id")
				var want map[string]any
				require.NoError(t, json.Unmarshal(w.Payload, &want))
				require.JSONEq(t, string(w.Payload), aws.ToString(m.Body), "body is the payload")
				require.Equal(t, "OrderCreated", attr("eventType"))
				require.Equal(t, "order", attr("aggregateType"))
				require.Equal(t, w.AggregateID, attr("aggregateId"))
				created, err := time.Parse(time.RFC3339Nano, attr("createdAt"))
				require.NoError(t, err, "createdAt is RFC 3339")
				require.WithinDuration(t, time.Now(), created, time.Minute)
				require.Equal(t, w.Headers["traceparent"], attr("traceparent"))
				if fifo {
					require.Equal(t, w.PartitionKey, m.Attributes["MessageGroupId"])
					require.Equal(t, w.EventID.String(), m.Attributes["MessageDeduplicationId"])
					order = append(order, attr("messageId"))
				}
			}
			if fifo {
				// Within a group, messages arrive in write order.
				last := map[string]int{}
				for _, id := range order {
					w := byID[id]
					var p struct{ Seq int }
					require.NoError(t, json.Unmarshal(w.Payload, &p))
					prev, seen := last[w.PartitionKey]
					require.True(t, !seen || p.Seq > prev, "group %s: seq %d after %d", w.PartitionKey, p.Seq, prev)
					last[w.PartitionKey] = p.Seq
				}
			}
		})
	}
}

func TestSNSPublisherQuarantinesAMissingTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, _, _, snsClient := topicWithRawQueue(t, false)
	b.write(t, 2, 2)
	r, err := outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: outbox.NewSNSPublisher(snsClient),
		Topics: map[string]string{testTopic: "arn:aws:sns:us-east-1:000000000000:does-not-exist"}})
	require.NoError(t, err)
	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Quarantined+st.Retrying, "neither row is marked published")
	require.Equal(t, 2, b.countWhere(t, "published_at IS NULL AND last_error IS NOT NULL"))
}

func TestAttributesRespectSNSLimitAndPutTraceContextFirst(t *testing.T) {
	t.Parallel()
	h := map[string]string{"traceparent": "tp", "tracestate": "ts"}
	for i := range 8 {
		h[fmt.Sprintf("h%d", i)] = "v"
	}
	e := &outbox.Event{EventID: uuid.New(), EventType: "E", AggregateType: "a", AggregateID: "1", CreatedAt: time.Now(), Headers: h}
	attrs := outbox.Attributes(e)
	require.Len(t, attrs, outbox.SNSMaxAttributes)
	require.Contains(t, attrs, "traceparent")
	require.Contains(t, attrs, "tracestate")
	require.Contains(t, attrs, "h0")
	require.NotContains(t, attrs, "h3")

	require.Equal(t, "_", outbox.GroupID("", ""))
	require.Equal(t, "order-1", outbox.GroupID("", "order-1"))
	long := outbox.GroupID("", strings.Repeat("x", 200))
	require.True(t, strings.HasPrefix(long, "sha256-"))
	require.LessOrEqual(t, len(long), 128)
	require.Equal(t, long, outbox.GroupID("", strings.Repeat("x", 200)), "stable")
	// A fleet's messages: the tenant qualifies the group, so two tenants' keys never share one.
	require.Equal(t, "acme:order-1", outbox.GroupID("acme", "order-1"))
	require.Equal(t, "acme:", outbox.GroupID("acme", ""))
	require.NotEqual(t, outbox.GroupID("acme", "order-1"), outbox.GroupID("globex", "order-1"))
	longA, longG := outbox.GroupID("acme", strings.Repeat("x", 200)), outbox.GroupID("globex", strings.Repeat("x", 200))
	require.True(t, strings.HasPrefix(longA, "sha256-"))
	require.LessOrEqual(t, len(longA), 128)
	require.NotEqual(t, longA, longG)
}
