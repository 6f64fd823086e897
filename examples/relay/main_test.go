package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/examples/internal/exampletest"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestRelayProcessPublishesAndStopsCleanlyOnSIGTERM runs the built example as ECS would: it
// becomes ready, publishes a backlog, is stopped with SIGTERM while still publishing, and exits 0
// having marked published every row whose message reached the queue; a second process publishes
// the rest, so every event arrives.
func TestRelayProcessPublishesAndStopsCleanlyOnSIGTERM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := exampletest.Build(t)

	dbURL := testdb.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	endpoint := localaws.TestEndpoint(t)
	awsCfg := localaws.TestConfig(t)
	snsc, sqsc := sns.NewFromConfig(awsCfg), sqs.NewFromConfig(awsCfg)
	p, err := localrun.CreatePipeline(ctx, snsc, sqsc, localrun.PipelineOptions{Name: fmt.Sprintf("ex-relay-%d", time.Now().UnixNano()%1e9)})
	require.NoError(t, err)
	t.Cleanup(func() { p.Delete(context.Background(), snsc, sqsc) })

	const events = 3000
	_, err = pool.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o-' || g, 'OrderCreated', 'k-' || (g % 200), '{"n": 1}' FROM generate_series(1, $1::int) g`, events)
	require.NoError(t, err)

	topics, _ := json.Marshal(map[string]string{"orders": p.TopicARN})
	env := append(os.Environ(), "DATABASE_URL="+dbURL, "AWS_ENDPOINT_URL="+endpoint, "AWS_REGION="+localaws.Region(),
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", lambdaenv.TopicARNs+"="+string(topics),
		"SLUICE_HEALTH_ADDR=127.0.0.1:0", "SLUICE_RELAY_BATCH_SIZE=50")

	// The first process: ready, publishing, then stopped mid-backlog.
	first, health := exampletest.Start(t, bin, env, "relay started")
	require.Equal(t, http.StatusOK, exampletest.Status(health, "/healthz"))
	require.Equal(t, http.StatusOK, exampletest.Status(health, "/readyz"))
	testwait.Until(t, "some rows published", func() bool { return published(t, pool) > 0 })
	require.NoError(t, first.Process.Signal(syscall.SIGTERM))
	require.NoError(t, first.Wait(), "SIGTERM ends the relay with exit code 0")

	// It finished its rounds: every message the broker acknowledged has its row marked
	// published (none will go out twice because of the stop), and no partition key stays locked.
	// Its sessions end with it (the server notices a closed connection a moment later), and
	// with them every key lock it held in this database.
	testwait.Until(t, "no partition key of this database stays locked", func() bool {
		var locks int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&locks))
		return locks == 0
	})
	delivered := map[string]bool{}
	drain(t, sqsc, p.QueueURL, delivered)
	require.NotEmpty(t, delivered)
	for id := range delivered {
		var marked bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM outbox_event WHERE event_id = $1`, id).Scan(&marked))
		require.True(t, marked, "event %s was acknowledged by SNS but its row was left unpublished by the stop", id)
	}
	t.Logf("first relay: %d of %d published before SIGTERM", published(t, pool), events)

	// A second process publishes the rest: every event reaches the queue at least once.
	second, _ := exampletest.Start(t, bin, env, "relay started")
	testwait.Until(t, "every row published", func() bool { return published(t, pool) == events })
	require.NoError(t, second.Process.Signal(syscall.SIGTERM))
	require.NoError(t, second.Wait())
	// A receive whose answer was lost on the way (the SDK retries it) leaves its messages
	// invisible for the queue's visibility timeout: wait for every event, not for the first
	// empty receive.
	testwait.Progress(t, "every event reached the queue", func() (int, bool) {
		drain(t, sqsc, p.QueueURL, delivered)
		return len(delivered), len(delivered) == events
	})
}

// drain receives and deletes the messages in the queue until a receive finds none, adding
// their event ids to seen.
func drain(t *testing.T, sqsc *sqs.Client, queueURL string, seen map[string]bool) {
	t.Helper()
	for {
		msgs, err := sqsc.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		require.NoError(t, err)
		if len(msgs.Messages) == 0 {
			return
		}
		for _, m := range msgs.Messages {
			seen[aws.ToString(m.MessageAttributes["messageId"].StringValue)] = true
			_, err := sqsc.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
	}
}

func published(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_event WHERE published_at IS NOT NULL`).Scan(&n))
	return n
}
