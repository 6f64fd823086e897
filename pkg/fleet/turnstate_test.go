package fleet_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
)

// turnStateOf reads tenant's row of fleet.TurnStateTable (ok false when it has none).
func turnStateOf(t *testing.T, control *pgxpool.Pool, tenant string) (fleet.TurnState, bool) {
	t.Helper()
	states, err := fleet.ReadTurnStates(context.Background(), control)
	require.NoError(t, err)
	for _, s := range states {
		if s.Tenant == tenant {
			return s, true
		}
	}
	return fleet.TurnState{}, false
}

// The fleet records its own view of each tenant in the control database: a tenant's turn
// that published (when, how long, how many rows, its backlog), a failing tenant's failures,
// error class and backoff (its password never written), and nothing more while a tenant is
// idle: its sweeps that find nothing write no row.
func TestTheFleetRecordsEachTenantsTurnsInTheControlDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	control, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	require.NoError(t, err)
	t.Cleanup(control.Close)
	require.NoError(t, fleet.CreateTurnStateTable(ctx, control))
	require.NoError(t, fleet.CreateTurnStateTable(ctx, control), "it can be run again")

	busy := newTenantDB(t, "busy")
	busy.write(t, 30, 3, 0)
	// A tenant whose database does not exist, reached with a password.
	u, err := url.Parse(testdb.ServerURL(t))
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "s3cret-pw")
	u.Path = "/no_such_tenant_db"
	broken := fleet.Tenant{Name: "broken", DatabaseURL: u.String()}

	f := runFleet(t, fleet.Config{Registry: fleet.Static{busy.tenant(), broken}, Relay: b.relay,
		SweepInterval: 300 * time.Millisecond, TurnState: control})
	b.receive(t, 30)

	var s fleet.TurnState
	testwait.Until(t, "busy's turns recorded with its 30 rows and no backlog", func() bool {
		s, _ = turnStateOf(t, control, "busy")
		return !s.WorkedAt.IsZero() && s.Lag.Pending == 0 && !s.LagAt.IsZero()
	})
	require.Equal(t, fleet.StateIdle, s.State)
	require.Zero(t, s.Failures)
	require.Empty(t, s.ErrorClass)
	require.True(t, s.BackoffUntil.IsZero())
	require.False(t, s.TurnEnded.Before(s.TurnStarted))
	require.Equal(t, "0/1", s.Shard)

	var bad fleet.TurnState
	testwait.Until(t, "broken's failures recorded", func() bool {
		bad, _ = turnStateOf(t, control, "broken")
		return bad.Failures >= 2
	})
	require.Equal(t, fleet.StateFailing, bad.State)
	require.Equal(t, fleet.ErrorAuth, bad.ErrorClass, bad.LastError)
	require.Contains(t, bad.LastError, "no_such_tenant_db")
	require.NotContains(t, bad.LastError, "s3cret-pw")
	require.True(t, bad.BackoffUntil.After(bad.TurnEnded), "backoff until %v, turn ended %v", bad.BackoffUntil, bad.TurnEnded)

	// Idle: three more sweeps of busy write nothing.
	s, _ = turnStateOf(t, control, "busy")
	turns := statusOf(t, f, "busy").Turns
	testwait.Until(t, "three more sweeps of busy", func() bool { return statusOf(t, f, "busy").Turns >= turns+3 })
	again, _ := turnStateOf(t, control, "busy")
	require.Equal(t, s.UpdatedAt, again.UpdatedAt, "an idle tenant's sweeps write nothing")

	// New rows: the turn that publishes them is recorded, with its rows.
	busy.write(t, 4, 2, 100)
	b.receive(t, 4)
	testwait.Until(t, "busy's new turn recorded", func() bool {
		again, _ = turnStateOf(t, control, "busy")
		return again.WorkedAt.After(s.WorkedAt)
	})
	require.LessOrEqual(t, again.Published, int64(4))
	require.Positive(t, again.Published)
	require.False(t, strings.Contains(again.LastError, "s3cret"))
}
