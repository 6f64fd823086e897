package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// span parses one span line as the stdout exporter writes it.
func span(t *testing.T, line string) jsonSpan {
	t.Helper()
	var s jsonSpan
	require.NoError(t, json.Unmarshal([]byte(line), &s))
	return s
}

// The demo assembles an order's trace whether the consumer span links to PlaceOrder (pkg/inbox's
// default, the messaging conventions) or is its child (TraceAsChild): make demo's last lines
// show one order's waterfall either way.
func TestTracesFollowLinksAndParents(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC).Format(time.RFC3339Nano)
	t1 := time.Date(2026, 12, 2, 8, 0, 0, 50e6, time.UTC).Format(time.RFC3339Nano)
	place := `{"Name":"PlaceOrder","SpanContext":{"TraceID":"t1","SpanID":"p1"},"StartTime":"` + t0 + `","EndTime":"` + t0 + `","Attributes":[{"Key":"` + attrOrderID + `","Value":{"Value":"o-1"}}]}`
	publish := `{"Name":"publish orders","SpanContext":{"TraceID":"t2","SpanID":"b1"},"StartTime":"` + t0 + `","EndTime":"` + t1 + `","Links":[{"SpanContext":{"TraceID":"t1","SpanID":"p1"}}],"Attributes":[{"Key":"sluice.publish.failed","Value":{"Value":0}}]}`
	linked := `{"Name":"process queue","SpanContext":{"TraceID":"t3","SpanID":"c1"},"StartTime":"` + t1 + `","EndTime":"` + t1 + `","Links":[{"SpanContext":{"TraceID":"t1","SpanID":"p1"}}],"Attributes":[{"Key":"sluice.inbox.outcome","Value":{"Value":"applied"}}]}`
	child := `{"Name":"process queue","SpanContext":{"TraceID":"t1","SpanID":"c2"},"Parent":{"TraceID":"t1","SpanID":"p1"},"StartTime":"` + t1 + `","EndTime":"` + t1 + `","Attributes":[{"Key":"sluice.inbox.outcome","Value":{"Value":"applied"}}]}`
	for name, consumer := range map[string]string{"linked": linked, "child": child} {
		all := traces([]jsonSpan{span(t, place), span(t, publish), span(t, consumer)})
		require.Len(t, all, 1, name)
		require.Equal(t, "o-1", all[0].orderID)
		require.Equal(t, 1, all[0].deliveries)
		var out bytes.Buffer
		printWaterfall(&out, []jsonSpan{span(t, place), span(t, publish), span(t, consumer)}, 1, "hop")
		require.Contains(t, out.String(), "one order's trace: o-1", name)
	}
	require.Empty(t, traces([]jsonSpan{span(t, place), span(t, publish)}), "not applied: not complete")
}
