package fleet_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// ackAll is a Publisher whose broker acknowledges every event at once.
type ackAll struct{ calls atomic.Int64 }

func (p *ackAll) PublishBatch(_ context.Context, _ string, events []*outbox.Event) []error {
	p.calls.Add(1)
	return make([]error, len(events))
}

// TestTheBudgetHoldsWhileSessionsAreSlowToOpen: many backlogged tenants take turns on a small
// budget while every new session is slow to finish its setup (as TLS and scram-sha-256 are on
// a busy server), so turns end, by their share of time, while a connection of theirs is still
// being opened. Every row is published, and the fleet's sessions on the server, as
// pg_stat_activity counts them, never exceed the budget: a session whose opening outlived its
// turn is closed, and gone, before its connection is counted free.
func TestTheBudgetHoldsWhileSessionsAreSlowToOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		tenants = 8
		rows    = 500
		budget  = 3 // two tenants' pools of one connection, and the activity poll
	)
	var (
		reg   fleet.Static
		dbs   []tenantDB
		names []string
	)
	for i := range tenants {
		d := newTenantDB(t, "t"+string(rune('a'+i)))
		d.backlog(t, rows)
		dbs = append(dbs, d)
		reg = append(reg, d.tenant())
		cfg, err := pgconn.ParseConfig(d.url)
		require.NoError(t, err)
		names = append(names, cfg.Database)
	}
	admin, err := pgxpool.New(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	most := sampleConnections(t, admin, names)

	relay := outbox.RelayConfig{Publisher: &ackAll{}, Topics: map[string]string{"orders": "arn:aws:sns:us-east-1:000000000000:orders"},
		BatchSize: 50}
	// Each session takes 150 ms after it opened (logged in, visible on the server) before the
	// pool hands it out; a turn's share is 10 ms: most turns end while their session opens.
	connect := func(_ context.Context, tn fleet.Tenant) (*pgxpool.Config, error) {
		pc, err := pgxpool.ParseConfig(tn.DatabaseURL)
		if err != nil {
			return nil, err
		}
		pc.AfterConnect = func(ctx context.Context, _ *pgx.Conn) error {
			time.Sleep(150 * time.Millisecond)
			return nil
		}
		return pc, nil
	}
	runFleet(t, fleet.Config{Registry: reg, Relay: relay, Connect: connect, DefaultConnections: budget, BurstPipelines: 1,
		Turn: 10 * time.Millisecond, BusyShare: 0.4, DetectInterval: 20 * time.Millisecond, RegistryRefresh: time.Hour})
	testwait.Until(t, "every tenant's backlog published", func() bool {
		for _, d := range dbs {
			if d.pending(t) > 0 {
				return false
			}
		}
		return true
	})
	require.LessOrEqual(t, most(), budget, "the fleet's sessions on the server, as pg_stat_activity counted them")
}

// TestSessionsOpeningAreNotTakenForHiddenOnes: clients connect to a tenant's database and
// disconnect again all the time. A session still starting shows no state in pg_stat_activity
// for a moment, as one hidden from the poll's role would; the poll does not take it for one:
// the tenant stays fully seen (DetectPoll), and no warning is logged.
func TestSessionsOpeningAreNotTakenForHiddenOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newTenantDB(t, "churn")
	logs := &syncBuffer{}
	relay := outbox.RelayConfig{Publisher: &ackAll{}, Topics: map[string]string{"orders": "arn:aws:sns:us-east-1:000000000000:orders"}}
	f := runFleet(t, fleet.Config{Registry: fleet.Static{d.tenant()}, Relay: relay, DetectInterval: 5 * time.Millisecond,
		RegistryRefresh: time.Hour, SweepInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	testwait.Until(t, "the tenant's first turn and a poll after it", func() bool {
		st := f.Status()
		return len(st) == 1 && st[0].Detection == fleet.DetectPoll
	})

	var polls atomic.Int64 // sessions opened, as a measure of the churn
	stop := make(chan struct{})
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				conn, err := pgx.Connect(ctx, d.url)
				if err == nil {
					_ = conn.Close(ctx)
					polls.Add(1)
				}
			}
		}()
	}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(logs.String(), "cannot see every session") {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	for range 4 {
		<-done
	}
	require.Positive(t, polls.Load(), "sessions were opened")
	require.NotContains(t, logs.String(), "cannot see every session", "a session opening is not a hidden one")
	require.Equal(t, fleet.DetectPoll, statusOf(t, f, "churn").Detection)
}
