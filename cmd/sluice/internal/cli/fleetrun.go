package cli

import (
	"context"
	"sync"

	"github.com/sluicehq/sluice/pkg/fleet"
)

// Bounds of the fleet commands' --parallel.
const (
	// MaxFleetParallel is the most tenants a fleet command works on at once: each holds a
	// connection, and tenants share servers.
	MaxFleetParallel = 32
)

// forEachTenant runs do for each tenant, at most parallel at once, starting them in the
// order given. done gets each result in the calling goroutine (so it needs no lock), in the
// order the tenants finish, with k the number finished so far. Once ctx ends no further
// tenant starts; those that started finish (do sees ctx end). The tenants that started are
// always a prefix of tenants: forEachTenant returns its length.
func forEachTenant[R any](ctx context.Context, tenants []fleet.Tenant, parallel int,
	do func(context.Context, fleet.Tenant) R, done func(k, i int, r R)) int {
	type result struct {
		i int
		r R
	}
	next := make(chan int)
	results := make(chan result)
	go func() {
		defer close(next)
		for i := range tenants {
			if ctx.Err() != nil {
				return
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range max(1, min(parallel, len(tenants))) {
		wg.Go(func() {
			for i := range next {
				results <- result{i, do(ctx, tenants[i])}
			}
		})
	}
	go func() {
		wg.Wait()
		close(results)
	}()
	k := 0
	for res := range results {
		k++
		done(k, res.i, res.r)
	}
	return k
}
