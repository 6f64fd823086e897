package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// keyed is the payload of the end-to-end tests: a key's events carry N = 0, 1, 2, ...
type keyed struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

// e2eBundle writes keyed events and records, in apply order, what the inbox applied.
type e2eBundle struct {
	*testBundle
	written int
}

func setupE2E(t *testing.T, keys, perKey int) *e2eBundle {
	t.Helper()
	b := &e2eBundle{testBundle: setup(t)}
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE applied (seq bigserial PRIMARY KEY, message_id text NOT NULL, key text NOT NULL, n int NOT NULL)`)
	require.NoError(t, err)
	// Interleaved, one transaction per event, as services write.
	for n := 0; n < perKey; n++ {
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("customer-%d", k)
			payload, _ := json.Marshal(keyed{Key: key, N: n})
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			_, err = outbox.Write(ctx, tx, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: key,
				EventType: "Keyed", PartitionKey: key, Payload: payload})
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			b.written++
		}
	}
	return b
}

func (b *e2eBundle) consumer(t *testing.T) *inbox.Consumer {
	t.Helper()
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Keyed", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		k, err := inbox.Decode[keyed](msg)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO applied (message_id, key, n) VALUES ($1, $2, $3)`, msg.ID, k.Key, k.N)
		return err
	})
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "ledger", Router: r, Logger: quiet})
	require.NoError(t, err)
	return c
}

// relay publishes every written row to dest with pub, as the relay Lambda does.
func (b *e2eBundle) relay(t *testing.T, pub outbox.Publisher, dest string) {
	t.Helper()
	r, err := outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": dest}, Logger: quiet,
		PublishTimeout: 20 * time.Second}) // moto answers slowly on a busy machine
	require.NoError(t, err)
	w := testwait.Watch[int](t, "the relay publishes every row")
	for {
		_, err := r.RunOnce(context.Background())
		require.NoError(t, err)
		var pending int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_event WHERE published_at IS NULL`).Scan(&pending))
		if pending == 0 {
			return
		}
		w.Check(pending)
	}
}

// requireExactlyOnce checks the inbox applied each written event once; with ordered, that each
// key's events were applied in write order.
func (b *e2eBundle) requireExactlyOnce(t *testing.T, ordered bool) {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT message_id, key, n FROM applied ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	seen := map[string]bool{}
	next := map[string]int{}
	for rows.Next() {
		var id, key string
		var n int
		require.NoError(t, rows.Scan(&id, &key, &n))
		require.False(t, seen[id], "message %s applied twice", id)
		seen[id] = true
		if ordered {
			require.Equal(t, next[key], n, "key %s applied in write order", key)
			next[key] = n + 1
		}
	}
	require.NoError(t, rows.Err())
	require.Len(t, seen, b.written, "every written event applied")
}

// Kinesis end to end on the emulator (moto): the real relay publishes to a two-shard stream,
// the consumer reads every shard from its start as Lambda's mapping does (each batch handed to
// HandleKinesis, and handed again, as a mapping retry would), and the inbox applies every event
// exactly once, each key's in write order.
func TestKinesisEndToEndExactlyOnceInKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := localaws.TestConfigServing(t, localaws.ServiceKinesis)
	kc := kinesis.NewFromConfig(cfg)
	name := "inbox-e2e-" + uuid.NewString()[:8]
	_, err := kc.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(2)})
	require.NoError(t, err)
	var streamARN string
	testwait.Until(t, "the stream is active", func() bool {
		d, err := kc.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
		if err != nil || d.StreamDescriptionSummary.StreamStatus != ktypes.StreamStatusActive {
			return false
		}
		streamARN = aws.ToString(d.StreamDescriptionSummary.StreamARN)
		return true
	})

	b := setupE2E(t, 6, 5)
	b.relay(t, outbox.NewKinesisPublisher(kc), streamARN)

	c := b.consumer(t)
	shards, err := kc.ListShards(ctx, &kinesis.ListShardsInput{StreamARN: aws.String(streamARN)})
	require.NoError(t, err)
	read := 0
	for _, s := range shards.Shards {
		it, err := kc.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamARN: aws.String(streamARN), ShardId: s.ShardId,
			ShardIteratorType: ktypes.ShardIteratorTypeTrimHorizon})
		require.NoError(t, err)
		iter := it.ShardIterator
		for empty := 0; iter != nil && empty < 3; {
			out, err := kc.GetRecords(ctx, &kinesis.GetRecordsInput{StreamARN: aws.String(streamARN), ShardIterator: iter, Limit: aws.Int32(7)})
			require.NoError(t, err)
			iter = out.NextShardIterator
			if len(out.Records) == 0 {
				empty++
				continue
			}
			ev := events.KinesisEvent{}
			for _, r := range out.Records {
				ev.Records = append(ev.Records, events.KinesisEventRecord{
					EventSource: "aws:kinesis", EventSourceArn: streamARN, EventID: aws.ToString(s.ShardId) + ":" + aws.ToString(r.SequenceNumber),
					Kinesis: events.KinesisRecord{Data: r.Data, PartitionKey: aws.ToString(r.PartitionKey), SequenceNumber: aws.ToString(r.SequenceNumber),
						KinesisSchemaVersion: "1.0"},
				})
			}
			read += len(out.Records)
			for range 2 { // the mapping may deliver a batch again
				resp, err := c.HandleKinesis(ctx, ev)
				require.NoError(t, err)
				require.Empty(t, resp.BatchItemFailures)
			}
		}
	}
	require.GreaterOrEqual(t, read, b.written, "every event is on the stream (copies from relay retries allowed)")
	b.requireExactlyOnce(t, true)
}

// EventBridge end to end on the emulator (moto): the real relay puts events on a bus whose rule
// delivers them whole to an SQS queue; the consumer processes what it receives (each batch
// twice, as SQS redelivers) and the inbox applies every event exactly once. EventBridge orders
// nothing, not even within one PutEvents call (docs/destinations.md), so key order is not
// checked here: a consumer of EventBridge must not rely on it.
func TestEventBridgeEndToEndExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := localaws.TestConfigServing(t, localaws.ServiceEventBridge, localaws.ServiceSQS)
	eb, sq := eventbridge.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	name := "inbox-e2e-" + uuid.NewString()[:8]
	bus, err := eb.CreateEventBus(ctx, &eventbridge.CreateEventBusInput{Name: aws.String(name)})
	require.NoError(t, err)
	queue, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	require.NoError(t, err)
	qa, err := sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: queue.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	require.NoError(t, err)
	queueARN := qa.Attributes["QueueArn"]
	_, err = eb.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String(name), EventBusName: aws.String(name),
		EventPattern: aws.String(`{"source":["` + outbox.DefaultEventSource + `"]}`)})
	require.NoError(t, err)
	_, err = eb.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String(name), EventBusName: aws.String(name),
		Targets: []ebtypes.Target{{Id: aws.String("queue"), Arn: aws.String(queueARN)}}})
	require.NoError(t, err)

	b := setupE2E(t, 4, 5)
	b.relay(t, outbox.NewEventBridgePublisher(eb, ""), aws.ToString(bus.EventBusArn))

	c := b.consumer(t)
	w := testwait.Watch[int](t, "every written row applied")
	for {
		var applied int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&applied))
		if applied >= b.written {
			break
		}
		w.Check(applied)
		out, err := sq.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: queue.QueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
		require.NoError(t, err)
		if len(out.Messages) == 0 {
			continue
		}
		ev := localrun.SQSEvent(out.Messages, queueARN)
		for range 2 {
			rep := c.Process(ctx, ev)
			require.Zero(t, rep.Count(inbox.Failed), "%+v", rep.Results)
		}
		for _, m := range out.Messages {
			_, err := sq.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: queue.QueueUrl, ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
	}
	b.requireExactlyOnce(t, false)
}
