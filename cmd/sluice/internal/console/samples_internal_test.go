package console

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The ring keeps the newest samples, oldest first, and since() cuts at a time.
func TestSamplesKeepTheNewestInOrder(t *testing.T) {
	t.Parallel()
	x := newSamples(3)
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for i := range 5 {
		x.add(sample{At: t0.Add(time.Duration(i) * time.Minute), Pending: int64(i)})
	}
	got := x.since(time.Time{})
	require.Len(t, got, 3)
	require.Equal(t, []int64{2, 3, 4}, []int64{got[0].Pending, got[1].Pending, got[2].Pending})
	got = x.since(t0.Add(3 * time.Minute))
	require.Equal(t, []int64{3, 4}, []int64{got[0].Pending, got[1].Pending})
}

// The chart places each sample at its time in the window and scales to the peak.
func TestLagChartPlacesSamplesInTheWindow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	ss := []sample{{At: now.Add(-ChartWindow), Pending: 0}, {At: now.Add(-ChartWindow / 2), Pending: 10}, {At: now, Pending: 5}}
	c := lagChart("Pending", ss, now, func(s sample) float64 { return float64(s.Pending) }, formatCount)
	pts := strings.Fields(c.Points)
	require.Equal(t, []string{"0.0,118.0", "300.0,2.0", "600.0,60.0"}, pts)
	require.Equal(t, "10", c.Max)
	require.Equal(t, "5", c.Last)

	empty := lagChart("Pending", nil, now, func(s sample) float64 { return 0 }, formatCount)
	require.Empty(t, empty.Points)
	require.Equal(t, "-", empty.Last)
}

func TestErrorGroupReplacesIDsAndNumbers(t *testing.T) {
	t.Parallel()
	require.Equal(t, "order <n> of <id> not found", errorGroup("order 17 of 6f1c9a1e-0c1e-4c53-9f5b-2a4b8f0d1e77 not found\nstack..."))
	require.Equal(t, errorGroup("ledger 17 closed"), errorGroup("ledger 18 closed"))
}

func TestTraceID(t *testing.T) {
	t.Parallel()
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", traceID("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	require.Empty(t, traceID("garbage"))
	require.Empty(t, traceID("00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
}
