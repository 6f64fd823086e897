package fleet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// TestBusyTenantsShareOneRoundMemory: eight tenants with backlogs of 8 KiB payloads, each
// tenant's relay running two pipelines at once on connections enough for all of them, so that
// sixteen rounds could each hold up to MaxRoundBytes (256 KiB) plus one payload, about 4 MiB in
// all. The fleet's relays share one round memory of 1 MiB: the payload bytes all the rounds in
// flight held at once, as the rounds counted what they read, stay within it, rounds waited for
// it, and every event is published once, each key in write order.
func TestBusyTenantsShareOneRoundMemory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const tenants, perTenant, keys = 8, 240, 24
	var reg fleet.Static
	want := map[string]int{}
	var dbs []tenantDB
	for i := range tenants {
		d := newTenantDB(t, fmt.Sprintf("busy-%d", i))
		_, err := d.pool.Exec(context.Background(), `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			SELECT gen_random_uuid(), 'orders', 'order', 'k-' || (g % $2), 'OrderCreated', 'k-' || (g % $2),
			       json_build_object('seq', g / $2, 'pad', repeat('x', 8192))
			FROM generate_series(0, $1 - 1) g`, perTenant, keys)
		require.NoError(t, err)
		reg = append(reg, d.tenant())
		want[d.name] = perTenant
		dbs = append(dbs, d)
	}
	const budget = 1 << 20
	memory := outbox.NewRoundMemory(budget)
	relay := b.relay
	relay.Pipelines, relay.MaxRoundBytes, relay.RoundMemory = 2, 256<<10, memory
	acks := &ackCounter{Publisher: relay.Publisher, acks: map[uuid.UUID]int{},
		before: func() { time.Sleep(20 * time.Millisecond) }} // calls that take a while: rounds overlap
	relay.Publisher = acks
	runFleet(t, fleet.Config{Registry: reg, Relay: relay, DefaultConnections: tenants*2 + 1, BurstPipelines: 2,
		SweepInterval: time.Second, RegistryRefresh: time.Hour})

	got := b.receive(t, tenants*perTenant)
	requireInOrder(t, got, want)
	require.Zero(t, acks.twice(), "no event acknowledged twice")
	for _, d := range dbs {
		require.Zero(t, d.pending(t), d.name)
	}
	st := memory.Stats()
	t.Logf("round memory: %+v", st)
	require.LessOrEqual(t, st.PeakLoaded, budget, "the payloads all rounds held at once stay within the process's budget")
	require.LessOrEqual(t, st.PeakReserved, budget)
	require.Positive(t, st.Waits, "rounds waited for the shared budget: it bounded them")
	require.Zero(t, st.Reserved, "every round gave its share back")
	require.Zero(t, st.Loaded)
}
