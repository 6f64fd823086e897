package emf

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEmitWritesOneValidEMFLine(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := New(&buf, map[string]string{"Service": "relay"})
	l.now = func() time.Time { return time.UnixMilli(1700000000000) }
	l.Emit(Metric{Name: "Published", Unit: Count, Value: 3}, Metric{Name: "Latency", Unit: Milliseconds, Values: []float64{1, 2}})

	require.Equal(t, 1, bytes.Count(buf.Bytes(), []byte("\n")))
	var got map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &got))
	require.Equal(t, "relay", got["Service"])
	require.Equal(t, 3.0, got["Published"])
	require.Equal(t, []any{1.0, 2.0}, got["Latency"])
	aws := got["_aws"].(map[string]any)
	require.Equal(t, 1700000000000.0, aws["Timestamp"])
	d := aws["CloudWatchMetrics"].([]any)[0].(map[string]any)
	require.Equal(t, Namespace, d["Namespace"])
	require.Equal(t, []any{[]any{"Service"}}, d["Dimensions"])
	require.Len(t, d["Metrics"], 2)
}
