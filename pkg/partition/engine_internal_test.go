package partition

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Partition names sort in key order, the former plain table first, so that a listing by name
// reads oldest to newest.
func TestPartitionNamesSortInKeyOrder(t *testing.T) {
	t.Parallel()
	ids := tableSpec{Table: "outbox_event", Kind: identityKey}
	var names []string
	for _, from := range []int64{minBound, 1, 999, 1000, 86_400_000, 1 << 40} {
		names = append(names, ids.partName(from))
	}
	require.True(t, slices.IsSorted(names), "%v", names)
	require.Equal(t, "outbox_event_p0", names[0])

	times := tableSpec{Table: "inbox_event", Kind: timeKey}
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	names = []string{times.partName(minBound)}
	for _, at := range []time.Time{day, day.Add(6 * time.Hour), day.Add(6*time.Hour + 30*time.Second), day.Add(24 * time.Hour)} {
		names = append(names, times.partName(at.UnixMicro()))
	}
	require.True(t, slices.IsSorted(names), "%v", names)
	require.Equal(t, []string{"inbox_event_p0", "inbox_event_p20261130", "inbox_event_p20261130_0600", "inbox_event_p20261130_060030", "inbox_event_p20261201"}, names)
	for _, n := range names {
		require.LessOrEqual(t, len(n), 63, "PostgreSQL's identifier limit")
	}
}

// timeKey bounds are written as UTC ISO 8601, which PostgreSQL reads the same whatever the
// session's DateStyle and TimeZone, and partitions start on multiples of the interval.
func TestTimeBoundsAreUnambiguousAndAligned(t *testing.T) {
	t.Parallel()
	s := tableSpec{Kind: timeKey}
	at := time.Date(2026, 11, 30, 13, 45, 10, 0, time.UTC)
	require.Equal(t, "'2026-11-30T13:45:10Z'", s.boundValue(at.UnixMicro()))
	require.Equal(t, "MINVALUE", s.boundValue(minBound))
	day := (24 * time.Hour).Microseconds()
	next := alignUp(at.UnixMicro(), day)
	require.Equal(t, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMicro(), next)
	require.Equal(t, next+day, alignUp(next, day), "strictly after a boundary")
}

// Options report every problem at once.
func TestOptionsReportEveryProblem(t *testing.T) {
	t.Parallel()
	err := Options{Interval: time.Millisecond, Ahead: 0, MinSize: 0, Size: -1, Retention: -time.Hour}.validate()
	require.Error(t, err)
	for _, field := range []string{"Interval", "Ahead", "MinSize", "Size", "Retention", "LockTimeout"} {
		require.True(t, strings.Contains(err.Error(), field), "%s in %v", field, err)
	}
	require.NoError(t, Options{}.withDefaults().validate())
}
