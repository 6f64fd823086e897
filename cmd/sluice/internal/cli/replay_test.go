package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// topicWithRawQueue creates an SNS topic and an SQS queue subscribed with raw delivery.
func topicWithRawQueue(t *testing.T, c *sqs.Client) (topicARN, queueURL string) {
	t.Helper()
	ctx := context.Background()
	snsClient := sns.NewFromConfig(localaws.TestConfig(t))
	name := "cli-replay-" + uuid.NewString()[:8]
	topic, err := snsClient.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(name)})
	require.NoError(t, err)
	q, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	require.NoError(t, err)
	qa, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	require.NoError(t, err)
	_, err = snsClient.Subscribe(ctx, &sns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint: aws.String(qa.Attributes["QueueArn"]), Attributes: map[string]string{"RawMessageDelivery": "true"}})
	require.NoError(t, err)
	return aws.ToString(topic.TopicArn), aws.ToString(q.QueueUrl)
}

// sqsEvent turns received messages into the Lambda event a consumer handles.
func sqsEvent(msgs []sqstypes.Message) events.SQSEvent {
	var ev events.SQSEvent
	for _, m := range msgs {
		r := events.SQSMessage{MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle), Body: aws.ToString(m.Body),
			Attributes: m.Attributes, MessageAttributes: map[string]events.SQSMessageAttribute{}, EventSource: "aws:sqs"}
		for k, v := range m.MessageAttributes {
			r.MessageAttributes[k] = events.SQSMessageAttribute{DataType: aws.ToString(v.DataType), StringValue: v.StringValue}
		}
		ev.Records = append(ev.Records, r)
	}
	return ev
}

// TestRelayAndReplay: relay --once publishes; replay publishes a chosen event again with the same
// event_id, which an existing consumer deduplicates and a fresh consumer applies once.
func TestRelayAndReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.withAWS(t)
	topicARN, queueURL := topicWithRawQueue(t, c)
	_, err := b.pool.Exec(ctx, `CREATE TABLE effect (consumer text NOT NULL, message_id text NOT NULL)`)
	require.NoError(t, err)
	consumer := func(name string) *inbox.Consumer {
		r := inbox.NewRouter(inbox.FailUnknown)
		r.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ($1, $2)`, name, msg.ID)
			return err
		})
		cons, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: name, Router: r})
		require.NoError(t, err)
		return cons
	}
	existing := consumer("billing")

	_, e1 := b.insertOutbox(t, outboxRow{aggID: "o-1"})
	b.insertOutbox(t, outboxRow{aggID: "o-2"})

	// Topic configuration comes from the relay Lambda's environment variables.
	b.env["SLUICE_TOPIC_ARNS"] = `{"orders":"` + topicARN + `"}`
	require.Contains(t, b.ok(t, "relay", "--once"), "published 2, retrying 0, destination outage 0, quarantined 0")
	first := drain(t, c, queueURL, 2)
	require.Len(t, first, 2)
	rep := existing.Process(ctx, sqsEvent(first))
	require.Equal(t, 2, rep.Count(inbox.Applied))

	// Without a terminal and without --yes, replay refuses and changes nothing.
	before := b.fingerprint(t)
	r := b.run(t, "replay", "--since", "-1h", "--aggregate-id", "o-1")
	requireOneLineError(t, r, 1, "refusing to replay 1 events (not confirmed)")
	require.Equal(t, before, b.fingerprint(t))
	require.Contains(t, b.ok(t, "replay", "--since", "-1h", "--aggregate-id", "o-1", "--dry-run"), "1 published events match")
	require.Equal(t, before, b.fingerprint(t), "--dry-run changes nothing")

	out := b.ok(t, "replay", "--since", "-1h", "--topic", "orders", "--aggregate-type", "order", "--aggregate-id", "o-1", "--yes")
	require.Contains(t, out, "1 published events match")
	require.Contains(t, out, "marked 1 events for publishing again")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM outbox_event WHERE published_at IS NULL"))

	require.Contains(t, b.ok(t, "relay", "--once", "--topic", "orders="+topicARN), "published 1,")
	again := drain(t, c, queueURL, 1)
	require.Len(t, again, 1)
	require.Equal(t, e1.String(), aws.ToString(again[0].MessageAttributes["messageId"].StringValue), "same event_id")
	var body map[string]string
	require.NoError(t, json.Unmarshal([]byte(aws.ToString(again[0].Body)), &body))
	require.Equal(t, "o-1", body["order"])

	require.Equal(t, 1, existing.Process(ctx, sqsEvent(again)).Count(inbox.Duplicate), "an existing consumer deduplicates the replay")
	fresh := consumer("rebuilt")
	require.Equal(t, 1, fresh.Process(ctx, sqsEvent(again)).Count(inbox.Applied), "a fresh consumer applies it")
	require.Equal(t, 1, fresh.Process(ctx, sqsEvent(again)).Count(inbox.Duplicate), "once")
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM effect WHERE consumer = 'billing'"))
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM effect WHERE consumer = 'rebuilt'"))
}

// Replay marks its rows in bounded batches, shows its progress, and reports exactly the rows it
// marked: not a row created after its plan, not a row that was already pending again.
func TestReplayMarksInBatchesExactlyWhatItReports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const rows = 25
	var ids []int64
	for i := range rows {
		id, _ := b.insertOutbox(t, outboxRow{aggID: fmt.Sprintf("o-%d", i%5), age: time.Hour, publishedAgo: ago(time.Hour)})
		ids = append(ids, id)
	}

	lines := jsonLines(t, b.ok(t, "replay", "--since", "-2h", "--batch-size", "4", "--yes", "--json"))
	plan := lineOf(t, lines, "plan")["plan"].(map[string]any)
	require.EqualValues(t, rows, plan["rows"])
	require.EqualValues(t, ids[0], plan["first_id"])
	require.EqualValues(t, ids[rows-1], plan["last_id"])
	progress := 0
	for _, l := range lines {
		if l["event"] == "progress" {
			progress++
		}
	}
	require.GreaterOrEqual(t, progress, 2, "a line per batch of 4 ids: %v", lines)
	require.EqualValues(t, rows, lineOf(t, lines, "result")["marked"])
	require.Equal(t, rows, b.count(t, "SELECT count(*) FROM outbox_event WHERE published_at IS NULL"))

	// Published again; then, between the plan and the run, a matching row is created and a
	// counted one becomes pending (another replay, say): neither is counted as marked.
	_, err := b.pool.Exec(ctx, `UPDATE outbox_event SET published_at = now()`)
	require.NoError(t, err)
	var late int64
	res, err := cli.Replay(ctx, b.pool, cli.ReplayOptions{Filter: outbox.ReplayFilter{Since: time.Now().Add(-2 * time.Hour), Until: time.Now()}, BatchSize: 3,
		Confirm: func(p outbox.ReplayPlan) error {
			late, _ = b.insertOutbox(t, outboxRow{aggID: "o-late", age: time.Minute, publishedAgo: ago(time.Minute)})
			_, err := b.pool.Exec(ctx, `UPDATE outbox_event SET published_at = NULL WHERE id = $1`, ids[7])
			return err
		}})
	require.NoError(t, err)
	require.EqualValues(t, rows, res.Plan.Rows)
	require.EqualValues(t, rows-1, res.Marked, "the row already pending is not marked again")
	require.Equal(t, rows, b.count(t, "SELECT count(*) FROM outbox_event WHERE published_at IS NULL"), "exactly the counted rows are pending")
	require.Equal(t, 0, b.count(t, fmt.Sprintf("SELECT count(*) FROM outbox_event WHERE id = %d AND published_at IS NULL", late)), "a row created after the plan is left alone")
}
