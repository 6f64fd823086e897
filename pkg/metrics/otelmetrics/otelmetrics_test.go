package otelmetrics_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicehq/sluice/pkg/metrics"
	"github.com/sluicehq/sluice/pkg/metrics/otelmetrics"
)

func TestRecorderMapsKindsToInstruments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	rec := otelmetrics.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	dims := metrics.Dimensions{metrics.DimensionService: metrics.ServiceConsumer, metrics.DimensionConsumer: "ledger"}
	for range 2 {
		rec.Record(ctx, dims,
			metrics.Measurement{Name: metrics.InboxProcessed.Name, Kind: metrics.Counter, Unit: metrics.Count, Value: 3},
			metrics.Measurement{Name: metrics.OutboxPending.Name, Kind: metrics.Gauge, Unit: metrics.Count, Value: 7},
			metrics.Measurement{Name: metrics.CommitToApplyLatency.Name, Kind: metrics.Histogram, Unit: metrics.Milliseconds, Samples: []float64{5, 15}})
	}

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	require.Len(t, rm.ScopeMetrics, 1)
	require.Equal(t, otelmetrics.ScopeName, rm.ScopeMetrics[0].Scope.Name)
	got := map[string]metricdata.Metrics{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		got[m.Name] = m
	}
	wantAttrs := attribute.NewSet(attribute.String("Consumer", "ledger"), attribute.String("Service", "consumer"))

	sum := got[metrics.InboxProcessed.Name].Data.(metricdata.Sum[float64])
	require.True(t, sum.IsMonotonic)
	require.Len(t, sum.DataPoints, 1)
	require.Equal(t, 6.0, sum.DataPoints[0].Value, "a counter adds")
	require.True(t, wantAttrs.Equals(&sum.DataPoints[0].Attributes), "dimensions are attributes")
	require.Equal(t, "1", got[metrics.InboxProcessed.Name].Unit)

	gauge := got[metrics.OutboxPending.Name].Data.(metricdata.Gauge[float64])
	require.Equal(t, 7.0, gauge.DataPoints[0].Value, "a gauge holds the last value")

	hist := got[metrics.CommitToApplyLatency.Name].Data.(metricdata.Histogram[float64])
	require.Len(t, hist.DataPoints, 1)
	require.EqualValues(t, 4, hist.DataPoints[0].Count, "each sample is an observation: %+v", hist.DataPoints)
	require.Equal(t, 40.0, hist.DataPoints[0].Sum)
	require.Equal(t, "ms", got[metrics.CommitToApplyLatency.Name].Unit)
}
