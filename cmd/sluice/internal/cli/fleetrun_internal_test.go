package cli

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/fleet"
)

func tenantsNamed(n int) []fleet.Tenant {
	ts := make([]fleet.Tenant, n)
	for i := range ts {
		ts[i].Name = fmt.Sprintf("t%02d", i)
	}
	return ts
}

// Every tenant is done once, never more than parallel at once, and done runs one call at a
// time, counting.
func TestFleetEachTenantOnceWithinTheBound(t *testing.T) {
	t.Parallel()
	for _, parallel := range []int{1, 3, 50} {
		ts := tenantsNamed(20)
		var inFlight, most atomic.Int32
		seen := map[int]int{}
		ks := []int{}
		started := forEachTenant(context.Background(), ts, parallel, func(_ context.Context, tn fleet.Tenant) string {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(time.Millisecond)
			inFlight.Add(-1)
			return tn.Name
		}, func(k, i int, name string) {
			seen[i]++
			ks = append(ks, k)
			require.Equal(t, ts[i].Name, name)
		})
		require.Equal(t, len(ts), started)
		require.Len(t, seen, len(ts))
		for i := range ts {
			require.Equal(t, 1, seen[i], "tenant %d done once", i)
			require.Equal(t, i+1, ks[i], "k counts the tenants done")
		}
		require.LessOrEqual(t, int(most.Load()), parallel)
	}
}

// Once the context ends no tenant starts: those that did are a prefix, and each was reported.
func TestFleetEachTenantStopsStartingWhenCancelled(t *testing.T) {
	t.Parallel()
	ts := tenantsNamed(10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reported []int
	started := forEachTenant(ctx, ts, 2, func(ctx context.Context, tn fleet.Tenant) error {
		if tn.Name == "t03" {
			cancel()
		}
		return ctx.Err()
	}, func(_, i int, _ error) { reported = append(reported, i) })
	require.GreaterOrEqual(t, started, 4)
	require.Less(t, started, len(ts))
	require.ElementsMatch(t, func() []int {
		var p []int
		for i := range started {
			p = append(p, i)
		}
		return p
	}(), reported)
}
