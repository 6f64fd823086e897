package cli_test

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// sluice fleet status shows what a real fleet relay, serving the registry of the control
// database, recorded there of each tenant: a tenant it published for (its last turn, the rows
// and its backlog), a failing one first (failures in a row, class, backoff, no password), and
// tenants without a recorded turn; it exits non-zero while one fails.
func TestFleetStatusShowsTheRelaysViewFromTheControlDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	controlURL := testdb.EmptyURL(t)
	tenant := setup(t)
	for range 5 {
		tenant.insertOutbox(t, outboxRow{})
	}
	b := &testBundle{env: map[string]string{"SLUICE_FLEET_REGISTRY_URL": controlURL}}
	requireOneLineError(t, b.run(t, "fleet", "status"), cli.ExitError, "sluice fleet init")
	require.Contains(t, b.ok(t, "fleet", "init"), "sluice_fleet_tenant_state is ready")
	b.ok(t, "fleet", "add", "acme", "--url", tenant.url, "--yes")
	u, err := url.Parse(testdb.ServerURL(t))
	require.NoError(t, err)
	u.User, u.Path = url.UserPassword(u.User.Username(), "hunter2-secret"), "/no_such_globex_db"
	b.ok(t, "fleet", "add", "globex", "--url", u.String(), "--yes")

	out := b.ok(t, "fleet", "status")
	require.Regexp(t, `(?m)^acme\s+no turn recorded$`, out)
	require.Contains(t, out, "2 tenants, 0 failing, 0 sweep-only (their writes wait for the sweep), 2 without a recorded turn")

	// The fleet relay as the Lambda wires it: the control database's table is its registry and
	// where it records the turns.
	control, err := pgxpool.New(ctx, controlURL)
	require.NoError(t, err)
	t.Cleanup(control.Close)
	f, err := fleet.New(fleet.Config{Registry: fleet.Table{DB: control}, TurnState: control, SweepInterval: time.Second,
		Relay: outbox.RelayConfig{Publisher: &stubBroker{}, Topics: map[string]string{"orders": "orders"}}})
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-done) })
	var ft cli.FleetTurns
	testwait.Until(t, "acme published, globex failed twice", func() bool {
		ft, err = cli.ReadFleetTurns(ctx, control, []fleet.Tenant{{Name: "acme"}, {Name: "globex"}})
		require.NoError(t, err)
		return len(ft.Tenants) == 2 && ft.Tenants[0].Failures >= 2 && !ft.Tenants[1].WorkedAt.IsZero()
	})

	r := b.run(t, "fleet", "status")
	requireOneLineError(t, r, cli.ExitError, "1 of 2 tenants failing")
	require.Regexp(t, `(?m)^globex\s+failing\s+\S+ ago\s+\S+\s+0\s+-\s+-\s+-\s+\d+\s+\d{4}-\d\d-\d\dT\S+\s+\S+\s+auth: .*no_such_globex_db`, r.out)
	require.Regexp(t, `(?m)^acme\s+idle\s+\S+ ago\s+\S+\s+\d+\s+\d+\s+\S+\s+\d+\s+0\s+-\s`, r.out)
	require.NotContains(t, r.out, "hunter2-secret")
	require.Contains(t, r.out, "2 tenants, 1 failing, 0 sweep-only (their writes wait for the sweep), 0 without a recorded turn")

	r = b.run(t, "fleet", "status", "--json")
	require.Equal(t, cli.ExitError, r.code)
	var lines []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.out), &lines), r.out)
	require.Len(t, lines, 2)
	require.Equal(t, "globex", lines[0]["tenant"])
	require.Equal(t, "auth", lines[0]["error_class"])
	require.NotEmpty(t, lines[0]["backoff_until"])
	require.Equal(t, false, lines[0]["sweep_only"])
	require.Equal(t, "acme", lines[1]["tenant"])
	require.NotEmpty(t, lines[1]["last_published_turn_at"])
}
