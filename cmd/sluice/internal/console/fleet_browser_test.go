package console_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/cmd/sluice/internal/console"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// acker acknowledges every event: a broker that always answers.
type acker struct{}

func (acker) PublishBatch(_ context.Context, _ string, events []*outbox.Event) []error {
	return make([]error, len(events))
}

// In a real browser, the fleet page shows the fleet relay's own view of its tenants, read
// from the control database with sluice fleet status's reader: a real fleet relay served a
// tenant with a backlog (its last turn and the rows it published) and failed on another
// (failures in a row, the error's class, backoff until, never its password); a sweep-only
// tenant is named as such, and a registered tenant without a recorded turn says so.
func TestBrowserFleetPageShowsTheRelaysView(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	control, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	require.NoError(t, err)
	t.Cleanup(control.Close)
	require.NoError(t, fleet.CreateTurnStateTable(ctx, control))

	b := setup(t, false) // acme's database: the seeded rows are its backlog
	u, err := url.Parse(testdb.ServerURL(t))
	require.NoError(t, err)
	u.User, u.Path = url.UserPassword(u.User.Username(), "hunter2-secret"), "/no_such_globex_db"
	acme := fleet.Tenant{Name: "acme", DatabaseURL: b.dbURL}
	globex := fleet.Tenant{Name: "globex", DatabaseURL: u.String()}
	f, err := fleet.New(fleet.Config{Registry: fleet.Static{acme, globex}, TurnState: control, SweepInterval: time.Second,
		Relay: outbox.RelayConfig{Publisher: acker{}, Topics: map[string]string{"orders": "orders"}}})
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-done) })
	testwait.Until(t, "acme published and globex failed twice, as recorded", func() bool {
		states, err := fleet.ReadTurnStates(ctx, control)
		require.NoError(t, err)
		var worked, failed bool
		for _, s := range states {
			worked = worked || s.Tenant == "acme" && !s.WorkedAt.IsZero()
			failed = failed || s.Tenant == "globex" && s.Failures >= 2
		}
		return worked && failed
	})
	// A relay on another server recorded umbrella: its activity poll could not see it.
	_, err = control.Exec(ctx, `INSERT INTO `+fleet.TurnStateTable+` (tenant, shard, state, turn_started_at, turn_ended_at,
		published, failures, error_class, last_error, detection) VALUES ('umbrella', '0/1', 'idle', now(), now(), 0, 0, '', '', 'sweep-only')`)
	require.NoError(t, err)

	registered := []fleet.Tenant{acme, globex, {Name: "initech", DatabaseURL: b.dbURL}, {Name: "umbrella", DatabaseURL: b.dbURL}}
	s, err := console.New(console.Config{DB: b.pool, FleetTurns: func(ctx context.Context) ([]fleet.TurnState, error) {
		ft, err := cli.ReadFleetTurns(ctx, control, registered)
		return ft.Tenants, err
	}})
	require.NoError(t, err)
	srv := serve(t, s)

	bctx := browser(t)
	step(t, bctx, chromedp.Navigate(srv+"/fleet"), chromedp.WaitVisible(chromedp.CSS("#fleet-turns")))
	summary := read(t, bctx, chromedp.Text(chromedp.CSS("#turns-summary")))
	require.Contains(t, summary, "4 tenants, 1 failing, 1 sweep-only, 1 without a recorded turn")
	rows := read(t, bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#fleet-turns tbody tr")).map(r => r.innerText)`))
	require.Len(t, rows, 4)
	require.True(t, strings.HasPrefix(rows[0], "globex"), "the failing tenant first: %q", rows)
	require.Regexp(t, `failing.*\d+ in a row.*auth.*no_such_globex_db.*backoff until`, strings.ReplaceAll(rows[0], "\n", " "))
	require.True(t, strings.HasPrefix(rows[1], "umbrella"), "then the sweep-only one: %q", rows)
	require.Contains(t, rows[1], "sweep-only")
	require.Regexp(t, `acme\s+idle.*ago, took .*rows published since the record before; last published .* ago`, strings.ReplaceAll(strings.Join(rows, "|"), "\n", " "))
	require.Contains(t, strings.Join(rows, "|"), "initech\tno turn recorded")
	page := read(t, bctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	require.NotContains(t, page, "hunter2-secret", "no password is rendered")
}
