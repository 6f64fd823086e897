package fleet

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/pkg/metrics"
)

// emitMetricsEvery emits the fleet's metrics every Relay.MetricsInterval until ctx ends, and
// once more then.
func (f *Fleet) emitMetricsEvery(ctx context.Context) {
	if f.cfg.MetricsRecorder == nil {
		return
	}
	published := map[string]int{} // each tenant's Published as last emitted
	t := time.NewTicker(f.cfg.Relay.MetricsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			f.emitMetrics(context.WithoutCancel(ctx), published)
			return
		case <-t.C:
			f.emitMetrics(ctx, published)
		}
	}
}

// emitMetrics records FleetTenants and FleetTenantsFailing with {Service=relay}, the shard's
// FleetShardHeartbeat with {Service=relay, Shard=<I/N>}, and the per-tenant figures: the TopTenants worst tenants by name, the rest together as
// OtherTenants, so the number of metrics stays bounded however large the fleet.
func (f *Fleet) emitMetrics(ctx context.Context, published map[string]int) {
	st := f.Status() // worst first
	failing := 0
	type figures struct {
		pending, quarantined int64
		oldest               time.Duration
		published            int
	}
	other := figures{}
	rec := f.cfg.MetricsRecorder
	record := func(tenant string, fig figures) {
		rec.Record(ctx, metrics.Dimensions{metrics.DimensionService: metrics.ServiceRelay, metrics.DimensionTenant: tenant},
			metrics.TenantOldestPendingAge.Measure(fig.oldest.Seconds()),
			metrics.TenantPending.Measure(float64(fig.pending)),
			metrics.TenantQuarantined.Measure(float64(fig.quarantined)),
			metrics.TenantPublished.Measure(float64(fig.published)))
	}
	for i, s := range st {
		delta := s.Published - published[s.Tenant.Name]
		published[s.Tenant.Name] = s.Published
		if s.State == StateFailing {
			failing++
		}
		fig := figures{pending: s.Lag.Pending, quarantined: s.Lag.Quarantined, oldest: s.Lag.OldestPendingAge, published: delta}
		if i >= f.cfg.TopTenants {
			other.pending += fig.pending
			other.quarantined += fig.quarantined
			other.oldest = max(other.oldest, fig.oldest)
			other.published += fig.published
			continue
		}
		record(s.Tenant.Name, fig)
	}
	if len(st) > f.cfg.TopTenants {
		record(OtherTenants, other)
	}
	rec.Record(ctx, metrics.Dimensions{metrics.DimensionService: metrics.ServiceRelay},
		metrics.FleetTenants.Measure(float64(len(st))),
		metrics.FleetTenantsFailing.Measure(float64(failing)))
	// The shard's own heartbeat: FleetTenants is summed over the shards, so one shard that
	// stops does not show there; its alarm (infra/, per shard) watches this.
	rec.Record(ctx, metrics.Dimensions{metrics.DimensionService: metrics.ServiceRelay, metrics.DimensionShard: metrics.FleetShard(f.cfg.Shard, f.cfg.Shards)},
		metrics.FleetShardHeartbeat.Measure(1))
}
