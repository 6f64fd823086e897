package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// TestFleetThreeTenantsOneRelayDeployment: three tenant databases, one relay deployment (the
// relay Lambda in fleet mode under the runtime emulator, on its schedule) and the consumer
// skeleton in fleet mode behind the FIFO queue. Every event is applied exactly once, in its own
// tenant's database only, and each tenant's keys in write order.
func TestFleetThreeTenantsOneRelayDeployment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	names := []string{"acme", "globex", "initech"}
	urls := map[string]string{}
	var tenants []fleet.Tenant
	for _, n := range names {
		urls[n] = testdb.URL(t)
		tenants = append(tenants, fleet.Tenant{Name: n, DatabaseURL: urls[n]})
	}
	list, err := json.Marshal(tenants)
	require.NoError(t, err)
	fleetEnv := lambdaenv.FleetTenants + "=" + string(list)
	b := setup(t, func(o *localrun.StackOptions) {
		o.FIFO = true
		o.Consumer = localrun.SkeletonFunction
		o.RelayEnv = append(o.RelayEnv, fleetEnv)
		o.ConsumerEnv = append(o.ConsumerEnv, fleetEnv)
	})

	const perTenant, keys = 60, 4
	written := map[string][]string{} // event ids per tenant, in write order
	for _, n := range names {
		pool, err := pgxpool.New(ctx, urls[n])
		require.NoError(t, err)
		for i := range perTenant {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			ids, err := outbox.Write(ctx, tx, outbox.Message{Topic: "orders", EventType: "OrderCreated", AggregateType: "order",
				AggregateID: fmt.Sprintf("%s-k%d", n, i%keys), Payload: json.RawMessage(fmt.Sprintf(`{"orderId":"%s-%d"}`, n, i))})
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			written[n] = append(written[n], ids[0].EventID.String())
		}
		pool.Close()
	}

	pools := map[string]*pgxpool.Pool{}
	for _, n := range names {
		pool, err := pgxpool.New(ctx, urls[n])
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		pools[n] = pool
	}
	applied := func(n string) int {
		var c int
		require.NoError(t, pools[n].QueryRow(ctx, `SELECT count(*) FROM inbox_event WHERE processed_at IS NOT NULL`).Scan(&c))
		return c
	}
	testwait.Progress(t, "every tenant's events applied", func() (int, bool) {
		total := 0
		for _, n := range names {
			total += applied(n)
		}
		return total, total >= len(names)*perTenant
	})
	time.Sleep(2 * time.Second) // a duplicate applied late would show now

	for _, n := range names {
		rows, err := pools[n].Query(ctx, `SELECT message_id, aggregate_id, headers->>'sluiceTenant' FROM inbox_event ORDER BY seq`)
		require.NoError(t, err)
		var got []string
		lastByKey := map[string]int{}
		position := map[string]int{}
		for i, id := range written[n] {
			position[id] = i
		}
		for rows.Next() {
			var id, key string
			var tenant *string
			require.NoError(t, rows.Scan(&id, &key, &tenant))
			pos, mine := position[id]
			require.True(t, mine, "%s's inbox holds only its own events (%s is not)", n, id)
			if tenant != nil {
				require.Equal(t, n, *tenant)
			}
			if last, ok := lastByKey[key]; ok {
				require.Greater(t, pos, last, "%s: key %s applied in write order", n, key)
			}
			lastByKey[key] = pos
			got = append(got, id)
		}
		require.NoError(t, rows.Err())
		require.Len(t, got, perTenant, "%s: every event applied exactly once", n)
		var pending int
		require.NoError(t, pools[n].QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE published_at IS NULL`).Scan(&pending))
		require.Zero(t, pending, n)
	}
	_ = b
}
