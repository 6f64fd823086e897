package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// TestFleetModeServesEveryTenantAcrossInvocations: with SLUICE_FLEET_TENANTS and the control
// table, one function publishes every tenant's rows; a second invocation of the same cold
// start serves rows written between the two, and a tenant added to the table in between.
func TestFleetModeServesEveryTenantAcrossInvocations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	awsCfg := localaws.TestConfig(t)
	snsc := sns.NewFromConfig(awsCfg)
	topic, err := snsc.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(fmt.Sprintf("relay-fleet-%d", time.Now().UnixNano()%1e9))})
	require.NoError(t, err)

	a, b, c := testdb.URL(t), testdb.URL(t), testdb.URL(t)
	control := testdb.Pool(t)
	require.NoError(t, fleet.CreateRegistryTable(ctx, control))
	require.NoError(t, fleet.AddTenant(ctx, control, fleet.Tenant{Name: "bravo", DatabaseURL: b}))
	static, _ := json.Marshal([]fleet.Tenant{{Name: "alpha", DatabaseURL: a}})
	env := map[string]string{
		lambdaenv.TopicARNs:          `{"orders":"` + aws.ToString(topic.TopicArn) + `"}`,
		lambdaenv.FleetTenants:       string(static),
		lambdaenv.FleetRegistryURL:   control.Config().ConnString(),
		lambdaenv.RelayStopBefore:    "1s",
		"AWS_ENDPOINT_URL":           localaws.TestEndpoint(t),
		"SLUICE_RELAY_POLL_INTERVAL": "50ms",
	}
	getenv := func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
	h, stop, err := wireFleet(ctx, getenv, awsCfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(stop)

	write := func(url string, n int) {
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		defer pool.Close()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		for range n {
			_, err = outbox.Write(ctx, tx, outbox.Message{Topic: "orders", EventType: "OrderCreated", AggregateID: "o-1", Payload: []byte(`{}`)})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit(ctx))
	}
	pending := func(url string) int {
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		defer pool.Close()
		lag, err := outbox.LagOf(ctx, pool)
		require.NoError(t, err)
		return int(lag.Pending)
	}
	invoke := func() FleetResult {
		ictx, cancel := context.WithDeadline(ctx, time.Now().Add(4*time.Second))
		defer cancel()
		res, err := h.Handle(ictx, scheduledEvent(t))
		require.NoError(t, err)
		return res
	}

	write(a, 3)
	write(b, 4)
	res := invoke()
	require.Equal(t, 2, res.Tenants)
	require.Zero(t, res.Failing)
	require.Zero(t, pending(a))
	require.Zero(t, pending(b))

	write(a, 2)
	require.NoError(t, fleet.AddTenant(ctx, control, fleet.Tenant{Name: "charlie", DatabaseURL: c}))
	write(c, 5)
	res = invoke()
	require.Equal(t, 3, res.Tenants)
	require.Zero(t, pending(a), "rows written between invocations are published")
	require.Zero(t, pending(c), "a tenant added to the control table is served")
	require.Equal(t, 14, res.Published)
}
