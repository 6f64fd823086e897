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

// emitMetrics records the fleet's totals with {Service=relay} (so the single relay's alarms
// watch the whole fleet) and the per-tenant figures: the TopTenants worst tenants by name,
// the rest together as OtherTenants, so the number of metrics stays bounded however large the
// fleet.
func (f *Fleet) emitMetrics(ctx context.Context, published map[string]int) {
	st := f.Status() // worst first
	var (
		failing, pending int
		oldest           time.Duration
		total            int
	)
	type figures struct {
		pending   int64
		oldest    time.Duration
		published int
	}
	other := figures{}
	rec := f.cfg.MetricsRecorder
	for i, s := range st {
		delta := s.Published - published[s.Tenant.Name]
		published[s.Tenant.Name] = s.Published
		total += delta
		pending += int(s.Lag.Pending)
		oldest = max(oldest, s.Lag.OldestPendingAge)
		if s.State == StateFailing {
			failing++
		}
		fig := figures{pending: s.Lag.Pending, oldest: s.Lag.OldestPendingAge, published: delta}
		if i >= f.cfg.TopTenants {
			other.pending += fig.pending
			other.oldest = max(other.oldest, fig.oldest)
			other.published += fig.published
			continue
		}
		rec.Record(ctx, metrics.Dimensions{metrics.DimensionService: metrics.ServiceRelay, metrics.DimensionTenant: s.Tenant.Name},
			metrics.TenantOldestPendingAge.Measure(fig.oldest.Seconds()),
			metrics.TenantPending.Measure(float64(fig.pending)),
			metrics.TenantPublished.Measure(float64(fig.published)))
	}
	if len(st) > f.cfg.TopTenants {
		rec.Record(ctx, metrics.Dimensions{metrics.DimensionService: metrics.ServiceRelay, metrics.DimensionTenant: OtherTenants},
			metrics.TenantOldestPendingAge.Measure(other.oldest.Seconds()),
			metrics.TenantPending.Measure(float64(other.pending)),
			metrics.TenantPublished.Measure(float64(other.published)))
	}
	rec.Record(ctx, metrics.Dimensions{metrics.DimensionService: metrics.ServiceRelay},
		metrics.RelayHeartbeat.Measure(1),
		metrics.FleetTenants.Measure(float64(len(st))),
		metrics.FleetTenantsFailing.Measure(float64(failing)),
		metrics.Published.Measure(float64(total)),
		metrics.OutboxPending.Measure(float64(pending)),
		metrics.OutboxOldestPendingAge.Measure(oldest.Seconds()))
}
