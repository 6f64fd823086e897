package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// gapPeriod is the tests' schedule period: AWS's 1 minute compressed, with the stop-before
// margin and the shard overlap at their shipped values (lambdaenv.DefaultRelayStopBefore,
// lambdaenv.FleetShardOverlap), so that a gap or an overlap lasts as long as on AWS.
const gapPeriod = 20 * time.Second

// TestFleetShardInvocationsHandOver runs a fleet shard as the CDK's OutboxFleet deploys it: the
// real relay binary in fleet mode under the runtime emulator, two execution environments (the
// shard's reserved concurrency), started by a schedule, with a function timeout of the period +
// lambdaenv.FleetShardOverlap + the stop-before margin. Rows are committed one at a time
// throughout several invocations. Each invocation is still serving when the next one starts (no
// moment without a relay: no gap), and through the overlaps every row reaches the queue exactly
// once, each key in id order. The commit-to-publish figures, around the invocations'
// boundaries and elsewhere, are logged (docs/fleet.md quotes them).
//
// The "timeout-equals-period" case is the old default (a timeout of one period: each
// invocation serves the period less the stop-before margin): it measures the gap the
// overlap closes, and asserts only what holds there too (exactly once, in order).
func TestFleetShardInvocationsHandOver(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		timeout time.Duration
		overlap bool
	}{
		{"overlap", gapPeriod + lambdaenv.FleetShardOverlap + lambdaenv.DefaultRelayStopBefore, true},
		{"timeout-equals-period", gapPeriod, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runShardBoundaries(t, c.timeout, c.overlap)
		})
	}
}

func runShardBoundaries(t *testing.T, timeout time.Duration, overlap bool) {
	ctx := context.Background()
	rie, bins := binaries(t)
	names := []string{"acme", "globex"}
	var tenants []fleet.Tenant
	pools := map[string]*pgxpool.Pool{}
	for _, n := range names {
		u := testdb.URL(t)
		tenants = append(tenants, fleet.Tenant{Name: n, DatabaseURL: u})
		pool, err := pgxpool.New(ctx, u)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		pools[n] = pool
	}
	list, err := json.Marshal(tenants)
	require.NoError(t, err)

	endpoint := localaws.TestEndpoint(t)
	cfg, err := localaws.Config(ctx, endpoint)
	require.NoError(t, err)
	snsc, sqsc := sns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	name := fmt.Sprintf("e2e-gap-%s-%d", map[bool]string{true: "o", false: "g"}[overlap], time.Now().UnixNano()%1e9)
	pipe, err := localrun.CreatePipeline(ctx, snsc, sqsc, localrun.PipelineOptions{Name: name, VisibilityTimeout: time.Minute, MaxReceiveCount: 5})
	require.NoError(t, err)
	t.Cleanup(func() { pipe.Delete(context.Background(), snsc, sqsc) })
	topics, err := json.Marshal(map[string]string{"orders": pipe.TopicARN})
	require.NoError(t, err)

	logPath := filepath.Join(t.TempDir(), "relay.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	relay, err := localrun.StartFunction(ctx, localrun.FunctionOptions{Name: "sluice-relay", RIE: rie,
		Bootstrap: filepath.Join(bins, localrun.RelayFunction, "bootstrap"), Timeout: timeout, Instances: 2, Log: logFile,
		Env: []string{lambdaenv.FleetTenants + "=" + string(list), lambdaenv.TopicARNs + "=" + string(topics),
			lambdaenv.RelayStopBefore + "=" + lambdaenv.DefaultRelayStopBefore.String(),
			"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=" + localaws.Region(), "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}})
	require.NoError(t, err)
	sched := &localrun.Schedule{Function: relay, Every: gapPeriod}
	schedCtx, stopSchedule := context.WithCancel(ctx)
	var swg sync.WaitGroup
	swg.Add(1)
	go func() { defer swg.Done(); sched.Run(schedCtx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopSchedule()
			swg.Wait() // the invocations in flight run to their end, as Lambda's would
			relay.Stop()
		}
	}
	t.Cleanup(func() {
		stop()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("relay log (tail):\n%s", b)
		}
	})

	insert := func(tenant string, i int) {
		_, err := pools[tenant].Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			VALUES (gen_random_uuid(), 'orders', 'order', $1, 'OrderCreated', $1, json_build_object('n', $2::int))`, fmt.Sprintf("k%d", i%3), i)
		require.NoError(t, err)
	}
	published := func() (done, total int) {
		for _, n := range names {
			var d, all int
			require.NoError(t, pools[n].QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NOT NULL), count(*) FROM outbox_event`).Scan(&d, &all))
			done, total = done+d, total+all
		}
		return done, total
	}
	// Warm: the first invocation's cold start is not a boundary.
	insert(names[0], -1)
	insert(names[1], -1)
	testwait.Progress(t, "the first invocation publishing", func() (int, bool) { d, _ := published(); return d, d == 2 })

	// Rows one at a time, alternating tenants, through two and a half periods: two boundaries
	// or more.
	window := gapPeriod*5/2 + 2*time.Second
	t0 := time.Now()
	for i := 0; time.Since(t0) < window; i++ {
		insert(names[i%2], i)
		time.Sleep(100 * time.Millisecond)
	}
	testwait.Progress(t, "every row published", func() (int, bool) { d, all := published(); return d, d == all })
	stop()

	// Exactly once on the queue: every event id once.
	seen := map[string]int{}
	for empty := 0; empty < 2; {
		out, err := sqsc.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(pipe.QueueURL), MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		require.NoError(t, err)
		if len(out.Messages) == 0 {
			empty++
			continue
		}
		empty = 0
		for _, m := range out.Messages {
			id := m.MessageAttributes["messageId"]
			require.NotNil(t, id.StringValue, "a message without its messageId attribute")
			seen[*id.StringValue]++
			_, err := sqsc.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(pipe.QueueURL), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
	}
	type row struct {
		commit  time.Time
		latency time.Duration
	}
	var rows []row
	for _, n := range names {
		r, err := pools[n].Query(ctx, `SELECT event_id::text, partition_key, created_at, published_at,
			published_at < max(published_at) OVER (PARTITION BY partition_key ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
			FROM outbox_event ORDER BY id`)
		require.NoError(t, err)
		for r.Next() {
			var id, key string
			var created, pub time.Time
			var early *bool
			require.NoError(t, r.Scan(&id, &key, &created, &pub, &early))
			require.Equal(t, 1, seen[id], "%s: event %s (key %s) reached the queue exactly once", n, id, key)
			require.False(t, early != nil && *early, "%s: event %s published before an earlier row of key %s", n, id, key)
			rows = append(rows, row{commit: created, latency: pub.Sub(created)})
		}
		require.NoError(t, r.Err())
	}
	require.Len(t, seen, len(rows), "no message on the queue that is not an outbox row")

	// The invocations' boundaries: each pair of invocations that follow one another.
	spans := sched.Spans()
	slices.SortFunc(spans, func(a, b localrun.Span) int { return a.Start.Compare(b.Start) })
	var boundaries [][2]time.Time
	var report []string
	for i := 1; i < len(spans); i++ {
		prev, next := spans[i-1], spans[i]
		require.False(t, prev.Failed, "invocation %d failed", i-1)
		lo, hi := prev.End, next.Start
		if hi.Before(lo) {
			lo, hi = hi, lo
		}
		boundaries = append(boundaries, [2]time.Time{lo.Add(-time.Second), hi.Add(2 * time.Second)})
		report = append(report, fmt.Sprintf("invocation %d stopped %+.1fs after invocation %d started", i-1, prev.End.Sub(next.Start).Seconds(), i))
		if overlap && next.Start.Before(t0.Add(window)) {
			require.True(t, prev.End.After(next.Start), "invocation %d was still serving when invocation %d started (%s)", i-1, i, report[len(report)-1])
		}
	}
	var near, far []time.Duration
	for _, r := range rows {
		if slices.ContainsFunc(boundaries, func(b [2]time.Time) bool { return !r.commit.Before(b[0]) && r.commit.Before(b[1]) }) {
			near = append(near, r.latency)
		} else {
			far = append(far, r.latency)
		}
	}
	t.Logf("timeout %s, period %s, stop before %s: %s", timeout, gapPeriod, lambdaenv.DefaultRelayStopBefore, strings.Join(report, "; "))
	t.Logf("commit-to-publish of the %d rows committed around a boundary: %s", len(near), spread(near))
	t.Logf("commit-to-publish of the other %d rows: %s", len(far), spread(far))
}

// spread gives p50, p99 and the max of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return fmt.Sprintf("p50 %s, p99 %s, max %s", at(0.5).Round(time.Millisecond), at(0.99).Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
}
