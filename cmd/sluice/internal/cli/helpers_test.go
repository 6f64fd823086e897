package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// testBundle is one test's database (and, on demand, the local SQS endpoint).
type testBundle struct {
	url  string
	pool *pgxpool.Pool
	env  map[string]string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	url := testdb.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testBundle{url: url, pool: pool, env: map[string]string{"DATABASE_URL": url}}
}

// withAWS points the CLI's environment at the local SNS/SQS endpoint and returns an SQS client.
func (b *testBundle) withAWS(t *testing.T) *sqs.Client {
	t.Helper()
	b.env["AWS_ENDPOINT_URL"] = localaws.TestEndpoint(t)
	return sqs.NewFromConfig(localaws.TestConfig(t))
}

type result struct {
	code     int
	out, err string
}

// run executes the CLI in-process with the bundle's environment (never the test process's).
func (b *testBundle) run(t *testing.T, args ...string) result {
	t.Helper()
	return b.runWith(t, context.Background(), nil, args...)
}

func (b *testBundle) runWith(t *testing.T, ctx context.Context, hooks *cli.Hooks, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(ctx, args, cli.IO{
		In: strings.NewReader(""), Out: &out, Err: &errb,
		Getenv: func(k string) string { return b.env[k] },
		Hooks:  hooks,
	})
	return result{code: code, out: out.String(), err: errb.String()}
}

// ok runs the CLI and requires success.
func (b *testBundle) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := b.run(t, args...)
	require.Equal(t, 0, r.code, "sluice %s\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.out, r.err)
	return r.out
}

// fingerprint digests every outbox and inbox row, to prove a command changed nothing.
func (b *testBundle) fingerprint(t *testing.T) string {
	t.Helper()
	var o, i string
	err := b.pool.QueryRow(context.Background(), `
		SELECT (SELECT md5(coalesce(string_agg(e::text, '|' ORDER BY id), '')) FROM outbox_event e),
		       (SELECT md5(coalesce(string_agg(e::text, '|' ORDER BY consumer, message_id), '')) FROM inbox_event e)`).Scan(&o, &i)
	require.NoError(t, err)
	return o + i
}

// outboxRow inserts an outbox row the way any producer may (plain SQL), then sets its state.
type outboxRow struct {
	topic, aggType, aggID string
	age                   time.Duration // created this long ago
	publishedAgo          *time.Duration
	quarantined           bool
}

func (b *testBundle) insertOutbox(t *testing.T, r outboxRow) (int64, uuid.UUID) {
	t.Helper()
	if r.topic == "" {
		r.topic = "orders"
	}
	if r.aggType == "" {
		r.aggType = "order"
	}
	if r.aggID == "" {
		r.aggID = "o-1"
	}
	eventID := uuid.New()
	var id int64
	var published any
	if r.publishedAgo != nil {
		published = time.Now().Add(-*r.publishedAgo)
	}
	var quarantined any
	if r.quarantined {
		quarantined = time.Now()
	}
	err := b.pool.QueryRow(context.Background(), `
		INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload,
		                          created_at, published_at, quarantined_at, attempts, last_error)
		VALUES ($1, $2, $3, $4, 'OrderCreated', $4, $5, now() - $6 * interval '1 millisecond', $7, $8,
		        CASE WHEN $8::timestamptz IS NULL THEN 0 ELSE 10 END,
		        CASE WHEN $8::timestamptz IS NULL THEN NULL ELSE 'SNS: topic not found' END)
		RETURNING id`,
		eventID, r.topic, r.aggType, r.aggID, fmt.Sprintf(`{"order":%q}`, r.aggID), r.age.Milliseconds(), published, quarantined).Scan(&id)
	require.NoError(t, err)
	return id, eventID
}

func ago(d time.Duration) *time.Duration { return &d }

// insertInbox inserts an inbox row: state is "processed", "unprocessed" or "parked".
func (b *testBundle) insertInbox(t *testing.T, consumer, messageID, state string, age time.Duration) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `
		INSERT INTO inbox_event (consumer, message_id, event_type, payload, received_at, processed_at, parked_at, attempts, last_error)
		VALUES ($1, $2, 'OrderCreated', '{}', now() - $3 * interval '1 millisecond',
		        CASE WHEN $4 = 'processed' THEN now() - $3 * interval '1 millisecond' END,
		        CASE WHEN $4 = 'parked' THEN now() END,
		        CASE WHEN $4 = 'parked' THEN 5 ELSE 0 END,
		        CASE WHEN $4 = 'parked' THEN 'handler: boom' END)`,
		consumer, messageID, age.Milliseconds(), state)
	require.NoError(t, err)
}

func (b *testBundle) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// queuePair creates a queue with a DLQ (maxReceiveCount 1) through the standard AWS APIs.
func queuePair(t *testing.T, c *sqs.Client, fifo bool) (queueURL, dlqURL string) {
	t.Helper()
	ctx := context.Background()
	name := "cli-" + uuid.NewString()[:8]
	attrs := map[string]string{}
	suffix := ""
	if fifo {
		attrs["FifoQueue"] = "true"
		suffix = ".fifo"
	}
	dlq, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + "-dlq" + suffix), Attributes: withRetention(attrs, "1209600")})
	require.NoError(t, err)
	qa, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: dlq.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	require.NoError(t, err)
	policy, _ := json.Marshal(map[string]any{"deadLetterTargetArn": qa.Attributes["QueueArn"], "maxReceiveCount": 1})
	qAttrs := withRetention(attrs, "345600")
	qAttrs["RedrivePolicy"] = string(policy)
	q, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + suffix), Attributes: qAttrs})
	require.NoError(t, err)
	return aws.ToString(q.QueueUrl), aws.ToString(dlq.QueueUrl)
}

func withRetention(attrs map[string]string, seconds string) map[string]string {
	out := map[string]string{"MessageRetentionPeriod": seconds}
	for k, v := range attrs {
		out[k] = v
	}
	return out
}

// queueDepth counts visible and in-flight messages.
func queueDepth(t *testing.T, c *sqs.Client, url string) int {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	require.NoError(t, err)
	var a, n int
	fmt.Sscan(out.Attributes["ApproximateNumberOfMessages"], &a)
	fmt.Sscan(out.Attributes["ApproximateNumberOfMessagesNotVisible"], &n)
	return a + n
}

// drain receives and deletes the messages of a queue until at least want arrived and two
// receives in a row then find none, so a copy sent twice is counted too. A receive whose answer
// was lost on the way (the SDK retries it) hides its messages for the visibility timeout: the
// wait is for want messages, not for the first empty receive.
func drain(t *testing.T, c *sqs.Client, url string, want int) []sqstypes.Message {
	t.Helper()
	var got []sqstypes.Message
	empty := 0
	testwait.Progress(t, "the queue's messages received", func() (int, bool) {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		require.NoError(t, err)
		if len(out.Messages) == 0 {
			empty++
			return len(got), len(got) >= want && empty >= 2
		}
		empty = 0
		for _, m := range out.Messages {
			got = append(got, m)
			_, err := c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
		return len(got), false
	})
	return got
}

// requireOneLineError checks the bad-input contract: non-zero exit, one line on stderr naming the problem.
func requireOneLineError(t *testing.T, r result, wantCode int, contains string) {
	t.Helper()
	require.Equal(t, wantCode, r.code, "stderr: %s", r.err)
	require.Equal(t, 1, strings.Count(r.err, "\n"), "exactly one line on stderr: %q", r.err)
	require.True(t, strings.HasPrefix(r.err, "sluice: "), r.err)
	require.Contains(t, r.err, contains)
}
