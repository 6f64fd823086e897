package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/partition"
)

func scheduledEvent(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/scheduled_event.json")
	require.NoError(t, err)
	return b
}

// The fixture is what EventBridge sends for a schedule, field for field.
func TestScheduledEventFixtureRoundTrips(t *testing.T) {
	t.Parallel()
	ev := fixture.Load[events.EventBridgeEvent](t, "testdata/scheduled_event.json")
	require.Equal(t, "Scheduled Event", ev.DetailType)
	require.Equal(t, "aws.events", ev.Source)
	out, err := json.Marshal(ev)
	require.NoError(t, err)
	require.JSONEq(t, string(scheduledEvent(t)), string(out))
}

// A scheduled event maintains the partitions of both tables as their owner: on plain tables it
// changes nothing; on partitioned ones it creates partitions ahead and, with the retention,
// drops the outbox partitions whose rows were all published before it, never one holding a
// recent row.
func TestScheduledEventMaintainsPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	dbURL := pool.Config().ConnString()
	h, err := wire(ctx, func(k string) string {
		return map[string]string{lambdaenv.DatabaseURL: dbURL, lambdaenv.OutboxRetention: "720h", lambdaenv.InboxRetention: "1000h"}[k]
	}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Equal(t, 720*time.Hour, h.partitions[partition.Outbox].Retention)
	require.Equal(t, 1000*time.Hour, h.partitions[partition.Inbox].Retention)

	out, err := h.Invoke(ctx, scheduledEvent(t))
	require.NoError(t, err)
	require.Equal(t, MaintenanceResult{}, out, "plain tables are left alone")

	// [MINVALUE, 100), [100, 200), [200, 300), default.
	h.partitions[partition.Outbox].Size, h.partitions[partition.Outbox].Ahead = 100, 2
	_, err = partition.Convert(ctx, pool, partition.Outbox, &partition.Options{Size: 100, Ahead: 2}, nil)
	require.NoError(t, err)
	_, err = partition.Convert(ctx, pool, partition.Inbox, nil, nil)
	require.NoError(t, err)
	insert := func(n int, created, published string) {
		_, err := pool.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
			SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k', '{}', `+created+`, `+published+` FROM generate_series(1, $1)`, n)
		require.NoError(t, err)
	}
	insert(199, "now() - interval '41 days'", "now() - interval '40 days'") // ids 1-199: expired
	insert(30, "now()", "now()")                                            // 200-229
	// An inbox partition ahead went missing (e.g. maintenance stopped for a while).
	before, err := partition.Read(ctx, pool, partition.Inbox)
	require.NoError(t, err)
	var last string
	for _, p := range before.Partitions {
		if !p.Default {
			last = p.Name
		}
	}
	_, err = pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{last}.Sanitize())
	require.NoError(t, err)

	out, err = h.Invoke(ctx, scheduledEvent(t))
	require.NoError(t, err)
	res := out.(MaintenanceResult)
	require.True(t, res.Outbox.Partitioned)
	require.True(t, res.Inbox.Partitioned)
	require.ElementsMatch(t, []string{"outbox_event_p0", "outbox_event_p0000000000000000100"}, res.Outbox.Dropped, "expired: dropped")
	require.NotEmpty(t, res.Outbox.Created, "partitions ahead of the newest id")
	require.Equal(t, []string{last}, res.Inbox.Created, "the missing inbox partition is created again")
	require.Empty(t, res.Inbox.Dropped, "no inbox partition is past its retention")

	layout, err := partition.Read(ctx, pool, partition.Outbox)
	require.NoError(t, err)
	ahead := 0
	for _, p := range layout.Partitions {
		require.NotEqual(t, "outbox_event_p0", p.Name)
		if !p.Default && p.From > 229 {
			ahead++
		}
	}
	require.Equal(t, 2, ahead, "partitions are kept ready above the newest id")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event`).Scan(&left))
	require.Equal(t, 30, left, "the rows within the retention stay")
	b, err := json.Marshal(res)
	require.NoError(t, err)
	require.Contains(t, string(b), `"dropped":["outbox_event_p`, "the response names what changed")
}

// A failed maintenance fails the invocation: the function's Errors metric is its alarm.
func TestScheduledMaintenanceFailureIsAnError(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testdb.ServerURL(t))
	require.NoError(t, err)
	u.Path = "/no_such_database"
	h, err := wire(context.Background(), func(k string) string { return map[string]string{lambdaenv.DatabaseURL: u.String()}[k] }, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, err = h.Invoke(context.Background(), scheduledEvent(t))
	require.ErrorContains(t, err, "partition maintenance: connect to the database")
}

// A CloudFormation request still goes to the custom resource handler, whose response is PUT to
// the event's ResponseURL; an event of any other kind is refused.
func TestInvokeDispatchesByEventKind(t *testing.T) {
	t.Parallel()
	var got cfn.Response
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &got)
	}))
	defer srv.Close()
	h, err := wire(context.Background(), func(k string) string { return map[string]string{lambdaenv.DatabaseURL: "postgres://unused/x"}[k] }, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ev := createEvent(t)
	ev.RequestType, ev.ResponseURL, ev.PhysicalResourceID = cfn.RequestDelete, srv.URL, PhysicalResourceID
	payload, err := json.Marshal(ev)
	require.NoError(t, err)
	_, err = h.Invoke(context.Background(), payload)
	require.NoError(t, err)
	require.Equal(t, cfn.StatusSuccess, got.Status, "Delete answered CloudFormation")
	require.Equal(t, PhysicalResourceID, got.PhysicalResourceID)

	_, err = h.Invoke(context.Background(), []byte(`{"Records":[{"eventSource":"aws:sqs"}]}`))
	require.ErrorContains(t, err, "neither a CloudFormation custom resource request nor an EventBridge scheduled event")

	_, err = wire(context.Background(), func(k string) string {
		return map[string]string{lambdaenv.DatabaseURL: "postgres://unused/x", lambdaenv.InboxRetention: "a month"}[k]
	}, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, lambdaenv.InboxRetention, "a bad setting stops the cold start, naming it")
}

// With SLUICE_AUDIT_CONSUMERS the schedule also audits each consumer: a published event the
// consumer never applied is counted and emitted as AuditMissingEvents, which its alarm reads.
func TestScheduledAuditEmitsMissingEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	dbURL := pool.Config().ConnString()
	h, err := wire(ctx, func(k string) string {
		return map[string]string{lambdaenv.DatabaseURL: dbURL, lambdaenv.AuditConsumers: "billing"}[k]
	}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	var emf bytes.Buffer
	h.metrics = &emf

	// Two events published half an hour ago; billing applied one of them.
	var applied, lost string
	require.NoError(t, pool.QueryRow(ctx, `WITH e AS (INSERT INTO outbox_event
		(event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o-' || g, 'OrderCreated', 'o-' || g, '{}',
		       now() - interval '30 minutes', now() - interval '30 minutes' FROM generate_series(1, 2) g
		RETURNING event_id::text, created_at)
		SELECT min(event_id), max(event_id) FROM e`).Scan(&applied, &lost))
	_, err = pool.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, created_at, processed_at)
		SELECT 'billing', event_id::text, event_type, created_at, now() FROM outbox_event WHERE event_id::text = $1`, applied)
	require.NoError(t, err)

	out, err := h.Invoke(ctx, scheduledEvent(t))
	require.NoError(t, err)
	require.Equal(t, []ConsumerAudit{{Consumer: "billing", Missing: 1}}, out.(MaintenanceResult).Audit)
	var line map[string]any
	require.NoError(t, json.Unmarshal(emf.Bytes(), &line), emf.String())
	require.Equal(t, 1.0, line["AuditMissingEvents"])
	require.Equal(t, 0.0, line["AuditUnpublishedEvents"])
	require.Equal(t, "billing", line["Consumer"])
	require.Equal(t, "audit", line["Service"])
}
