package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgcluster"
)

// clusterTest runs t in parallel when it may start a PostgreSQL cluster (not -short, the
// server's binaries here; otherwise it skips, saying why), and returns a context bounded by
// limit and a logger that discards.
func clusterTest(t *testing.T, limit time.Duration) (context.Context, *slog.Logger) {
	t.Helper()
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	if _, err := pgcluster.BinDir(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx, slog.New(slog.NewTextHandler(io.Discard, nil))
}
