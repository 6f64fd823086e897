package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// In fleet mode (SLUICE_FLEET_TENANTS) the function applies each message in its tenant's
// database: an async consumer's event source invocation stores each message there, the
// schedule's invocation applies every tenant's stored rows, once. The same message id in two
// tenants is two messages (each tenant's inbox is its own); a message of a tenant the fleet
// does not list fails alone and leaves nothing in any database.
func TestTenantFleetStoresAndAppliesInEachTenantsDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urls := map[string]string{"acme": testdb.URL(t), "globex": testdb.URL(t)}
	tenants, err := json.Marshal([]map[string]string{{"name": "acme", "databaseUrl": urls["acme"]}, {"name": "globex", "databaseUrl": urls["globex"]}})
	require.NoError(t, err)
	getenv := func(k string) string {
		return map[string]string{lambdaenv.ConsumerName: "billing", lambdaenv.ConsumerCommitMode: "async",
			lambdaenv.FleetTenants: string(tenants)}[k]
	}
	cfg, err := lambdaenv.ConsumerConfig(getenv)
	require.NoError(t, err)
	var logs bytes.Buffer
	h, closeDB, err := newHandler(ctx, cfg, getenv, slog.New(slog.NewJSONHandler(&logs, nil)))
	require.NoError(t, err)
	defer closeDB()

	base := sqsEvent(t).Records[0]
	var ev events.SQSEvent
	for _, tenant := range []string{"acme", "globex", "nobody"} {
		r := base
		r.MessageId = "sqs-" + tenant
		r.MessageAttributes = map[string]events.SQSMessageAttribute{inbox.TenantHeader: {DataType: "String", StringValue: &tenant}}
		for k, v := range base.MessageAttributes {
			r.MessageAttributes[k] = v
		}
		ev.Records = append(ev.Records, r)
	}
	raw, err := json.Marshal(ev)
	require.NoError(t, err)
	for range 2 { // redelivered: the second time, duplicates
		resp, err := h.Handle(ctx, raw)
		require.NoError(t, err)
		require.Equal(t, []events.SQSBatchItemFailure{{ItemIdentifier: "sqs-nobody"}}, resp.(events.SQSEventResponse).BatchItemFailures)
	}
	state := func(tenant string) string {
		db, err := pgxpool.New(ctx, urls[tenant])
		require.NoError(t, err)
		defer db.Close()
		var stored, applied, letters int
		require.NoError(t, db.QueryRow(ctx, `SELECT (SELECT count(*) FROM inbox_event WHERE consumer = 'billing'),
			(SELECT count(processed_at) FROM inbox_event WHERE consumer = 'billing'), (SELECT count(*) FROM inbox_dead_letter)`).Scan(&stored, &applied, &letters))
		return fmt.Sprintf("stored %d, applied %d, dead letters %d", stored, applied, letters)
	}
	for tenant := range urls {
		require.Equal(t, "stored 1, applied 0, dead letters 0", state(tenant), tenant)
	}
	require.Contains(t, logs.String(), `"class":"unknown-tenant"`)

	sctx, cancel := context.WithTimeout(ctx, lambdaenv.DefaultConsumerDeadlineMargin+2*time.Second) // it runs until the margin before its deadline
	defer cancel()
	out, err := h.Handle(sctx, scheduled)
	require.NoError(t, err)
	require.Equal(t, "billing", out.(ProcessorRun).Consumer)
	for tenant := range urls {
		require.Equal(t, "stored 1, applied 1, dead letters 0", state(tenant), tenant)
	}
	require.Equal(t, 2, bytes.Count(logs.Bytes(), []byte(`"orderId":"o-42"`)), "the handler ran once per tenant")
}
