package metrics

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the metrics table of docs/deploy.md from All")

const (
	docsPath   = "../../docs/deploy.md"
	tableStart = "<!-- metrics table: generated from pkg/metrics.All by `go test ./pkg/metrics -run TestDocsTable -update` -->\n"
	tableEnd   = "<!-- end of metrics table -->\n"
)

// docsTable renders All as the Markdown table docs/deploy.md shows.
func docsTable() string {
	var b strings.Builder
	b.WriteString("| metric | kind | unit | emitted by (`Service`) | dimensions | meaning |\n|---|---|---|---|---|---|\n")
	for _, m := range All() {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", m.Name, m.Kind, m.Unit,
			strings.Join(m.Services, ", "), strings.Join(m.Dimensions, ", "), m.Doc)
	}
	return b.String()
}

// TestDocsTable keeps the table of docs/deploy.md equal to the definitions: a metric added,
// renamed or re-documented here fails it until the table is regenerated (-update).
func TestDocsTable(t *testing.T) {
	b, err := os.ReadFile(docsPath)
	require.NoError(t, err)
	doc := string(b)
	i, j := strings.Index(doc, tableStart), strings.Index(doc, tableEnd)
	require.True(t, i >= 0 && j > i, "docs/deploy.md has no metrics table markers")
	want := doc[:i+len(tableStart)] + docsTable() + doc[j:]
	if *update {
		require.NoError(t, os.WriteFile(docsPath, []byte(want), 0o644))
		return
	}
	require.Equal(t, want, doc, "docs/deploy.md's metrics table is stale: go test ./pkg/metrics -run TestDocsTable -update")
}

// TestDefinitions checks that every metric is complete and named once.
func TestDefinitions(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, m := range All() {
		require.False(t, seen[m.Name], "%s is defined twice", m.Name)
		seen[m.Name] = true
		require.NotEmpty(t, m.Unit, m.Name)
		require.NotEmpty(t, m.Services, m.Name)
		require.NotEmpty(t, m.Doc, m.Name)
		require.Equal(t, DimensionService, m.Dimensions[0], m.Name)
		for _, s := range m.Services {
			if s == ServiceRelay {
				require.Contains(t, [][]string{{DimensionService}, {DimensionService, DimensionTenant}, {DimensionService, DimensionShard}}, m.Dimensions,
					"%s: relay metrics carry {Service}, a fleet's per-tenant ones {Service, Tenant}, its per-shard ones {Service, Shard}", m.Name)
			} else {
				require.Equal(t, []string{DimensionService, DimensionConsumer}, m.Dimensions, m.Name)
			}
		}
	}
	got := InboxParked.Measure(2)
	require.Equal(t, Measurement{Name: "InboxParked", Kind: Counter, Unit: Count, Value: 2}, got)
	require.Equal(t, Measurement{Name: "CommitToApplyLatency", Kind: Histogram, Unit: Milliseconds, Samples: []float64{1}},
		CommitToApplyLatency.Observe([]float64{1}))
}
