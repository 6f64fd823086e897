package metrics

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func fixedEMF(buf *bytes.Buffer) *EMF {
	l := NewEMF(buf)
	l.now = func() time.Time { return time.UnixMilli(1700000000000) }
	return l
}

// TestEMFIsByteCompatible pins the lines the EMF writer wrote before the Recorder interface
// existed (captured from the former internal/emf.Logger): CloudWatch metric filters and alarms read them.
func TestEMFIsByteCompatible(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := fixedEMF(&buf)
	ctx := context.Background()
	l.Record(ctx, Dimensions{DimensionService: ServiceConsumer, DimensionConsumer: "ledger"},
		Measurement{Name: InboxProcessed.Name, Unit: Count, Value: 3},
		Measurement{Name: InboxDuplicates.Name, Unit: Count, Value: 0},
		Measurement{Name: CommitToApplyLatency.Name, Kind: Histogram, Unit: Milliseconds, Samples: []float64{12, 7.5}})
	l.Record(ctx, Dimensions{DimensionService: ServiceRelay},
		Measurement{Name: RelayHeartbeat.Name, Unit: Count, Value: 1},
		Measurement{Name: OutboxOldestPendingAge.Name, Kind: Gauge, Unit: Seconds, Value: 0.25})
	want := "{\"CommitToApplyLatency\":[12,7.5],\"Consumer\":\"ledger\",\"InboxDuplicates\":0,\"InboxProcessed\":3,\"Service\":\"consumer\",\"_aws\":{\"Timestamp\":1700000000000,\"CloudWatchMetrics\":[{\"Namespace\":\"Sluice\",\"Dimensions\":[[\"Consumer\",\"Service\"]],\"Metrics\":[{\"Name\":\"InboxProcessed\",\"Unit\":\"Count\"},{\"Name\":\"InboxDuplicates\",\"Unit\":\"Count\"},{\"Name\":\"CommitToApplyLatency\",\"Unit\":\"Milliseconds\"}]}]}}\n" +
		"{\"OutboxOldestPendingAgeSeconds\":0.25,\"RelayHeartbeat\":1,\"Service\":\"relay\",\"_aws\":{\"Timestamp\":1700000000000,\"CloudWatchMetrics\":[{\"Namespace\":\"Sluice\",\"Dimensions\":[[\"Service\"]],\"Metrics\":[{\"Name\":\"RelayHeartbeat\",\"Unit\":\"Count\"},{\"Name\":\"OutboxOldestPendingAgeSeconds\",\"Unit\":\"Seconds\"}]}]}}\n"
	require.Equal(t, want, buf.String())
}

func TestEMFSplitsHistogramsAt100Values(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	samples := make([]float64, 250)
	for i := range samples {
		samples[i] = float64(i)
	}
	fixedEMF(&buf).Record(context.Background(), Dimensions{DimensionService: ServiceConsumer},
		Measurement{Name: InboxProcessed.Name, Value: 250, Unit: Count},
		Measurement{Name: CommitToApplyLatency.Name, Kind: Histogram, Unit: Milliseconds, Samples: samples})
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 3)
	var got []float64
	for i, line := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		_, hasCount := m[InboxProcessed.Name]
		require.Equal(t, i == 0, hasCount, "the counts are on the first line only")
		vs := m[CommitToApplyLatency.Name].([]any)
		require.LessOrEqual(t, len(vs), 100)
		for _, v := range vs {
			got = append(got, v.(float64))
		}
	}
	require.Equal(t, samples, got, "every sample, once, in order")
}

func TestTee(t *testing.T) {
	t.Parallel()
	require.Nil(t, Tee(nil, nil))
	var a, b bytes.Buffer
	ea := NewEMF(&a)
	require.Same(t, ea, Tee(nil, ea))
	Tee(ea, NewEMF(&b)).Record(context.Background(), Dimensions{DimensionService: ServiceRelay}, Measurement{Name: Published.Name, Value: 2})
	require.Contains(t, a.String(), `"Published":2`)
	require.Contains(t, b.String(), `"Published":2`)
}
