package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// FleetTurns is the fleet relay's own view of its tenants, as `sluice fleet status` prints it
// and the console's fleet page shows it: each registered tenant's row of fleet.TurnStateTable,
// worst first.
type FleetTurns struct {
	// Tenants are the registered tenants' rows, worst first (turnsWorstFirst); a tenant the
	// relay has not recorded yet has a row with its name alone (State "").
	Tenants []fleet.TurnState
	// Failing, SweepOnly and Unrecorded count the failing tenants, those the activity poll
	// cannot see, and those without a recorded turn.
	Failing, SweepOnly, Unrecorded int
}

// ReadFleetTurns reads the fleet relay's view of the registered tenants from the control
// database (fleet.ReadTurnStates), worst first.
func ReadFleetTurns(ctx context.Context, control fleet.Querier, registered []fleet.Tenant) (FleetTurns, error) {
	states, err := fleet.ReadTurnStates(ctx, control)
	if err != nil {
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == "42P01" {
			return FleetTurns{}, fmt.Errorf("the fleet relay's table %s does not exist in the control database (create it with `sluice fleet init`; the relay then records its tenants' turns)", fleet.TurnStateTable)
		}
		return FleetTurns{}, err
	}
	byName := make(map[string]fleet.TurnState, len(states))
	for _, s := range states {
		byName[s.Tenant] = s
	}
	var ft FleetTurns
	for _, t := range registered {
		s, ok := byName[t.Name]
		if !ok {
			s = fleet.TurnState{Tenant: t.Name}
			ft.Unrecorded++
		}
		if s.State == fleet.StateFailing {
			ft.Failing++
		}
		if s.SweepOnly() {
			ft.SweepOnly++
		}
		ft.Tenants = append(ft.Tenants, s)
	}
	slices.SortFunc(ft.Tenants, turnsWorstFirst)
	return ft, nil
}

// turnsWorstFirst orders the failing tenants first, then the sweep-only ones, then the older
// oldest pending row, the larger backlog, then by name.
func turnsWorstFirst(a, b fleet.TurnState) int {
	if fa, fb := a.State == fleet.StateFailing, b.State == fleet.StateFailing; fa != fb {
		if fa {
			return -1
		}
		return 1
	}
	if sa, sb := a.SweepOnly(), b.SweepOnly(); sa != sb {
		if sa {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(b.Lag.OldestPendingAge, a.Lag.OldestPendingAge); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Lag.Pending, a.Lag.Pending); c != 0 {
		return c
	}
	return strings.Compare(a.Tenant, b.Tenant)
}

// fleetTurnJSON is a tenant's line of `sluice fleet status --json`.
type fleetTurnJSON struct {
	Tenant          string     `json:"tenant"`
	Recorded        bool       `json:"recorded"`
	Shard           string     `json:"shard,omitempty"`
	State           string     `json:"state,omitempty"`
	LastTurnAt      *time.Time `json:"last_turn_at,omitempty"`
	LastTurnSeconds float64    `json:"last_turn_seconds"`
	LastTurnRows    int64      `json:"last_turn_published"`
	PublishedAt     *time.Time `json:"last_published_turn_at,omitempty"`
	Pending         *int64     `json:"pending,omitempty"`
	OldestSeconds   *float64   `json:"oldest_pending_age_seconds,omitempty"`
	Quarantined     *int64     `json:"quarantined,omitempty"`
	LagAt           *time.Time `json:"backlog_read_at,omitempty"`
	Failures        int        `json:"failures"`
	ErrorClass      string     `json:"error_class,omitempty"`
	LastError       string     `json:"last_error,omitempty"`
	BackoffUntil    *time.Time `json:"backoff_until,omitempty"`
	Detection       string     `json:"detection,omitempty"`
	SweepOnly       bool       `json:"sweep_only"`
	UpdatedAt       *time.Time `json:"updated_at,omitempty"`
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func (ft FleetTurns) json() []fleetTurnJSON {
	out := make([]fleetTurnJSON, 0, len(ft.Tenants))
	for _, s := range ft.Tenants {
		j := fleetTurnJSON{Tenant: s.Tenant, Recorded: s.State != ""}
		if j.Recorded {
			j.Shard, j.State, j.LastTurnAt, j.LastTurnSeconds, j.LastTurnRows = s.Shard, string(s.State), timeOrNil(s.TurnEnded), s.Took().Seconds(), s.Published
			j.PublishedAt, j.Failures, j.ErrorClass, j.LastError = timeOrNil(s.WorkedAt), s.Failures, s.ErrorClass, s.LastError
			j.BackoffUntil, j.Detection, j.SweepOnly, j.UpdatedAt = timeOrNil(s.BackoffUntil), string(s.Detection), s.SweepOnly(), timeOrNil(s.UpdatedAt)
			if !s.LagAt.IsZero() {
				o := s.Lag.OldestPendingAge.Seconds()
				j.Pending, j.OldestSeconds, j.Quarantined, j.LagAt = &s.Lag.Pending, &o, &s.Lag.Quarantined, timeOrNil(s.LagAt)
			}
		}
		out = append(out, j)
	}
	return out
}

// printFleetTurns prints one line per tenant, worst first, ages as of now.
func printFleetTurns(w io.Writer, ft FleetTurns, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tSTATE\tLAST TURN\tTOOK\tROWS\tPENDING\tOLDEST\tQUARANTINED\tFAILURES\tBACKOFF UNTIL\tDETECTION\tLAST ERROR")
	for _, s := range ft.Tenants {
		if s.State == "" {
			fmt.Fprintf(tw, "%s\tno turn recorded\n", s.Tenant)
			continue
		}
		pending, oldest, quarantined := "-", "-", "-"
		if !s.LagAt.IsZero() {
			pending, oldest, quarantined = fmt.Sprint(s.Lag.Pending), FormatDuration(s.Lag.OldestPendingAge), fmt.Sprint(s.Lag.Quarantined)
		}
		backoff, detection, lastErr := "-", string(s.Detection), "-"
		if !s.BackoffUntil.IsZero() {
			backoff = s.BackoffUntil.UTC().Format(time.RFC3339)
		}
		if detection == "" {
			detection = "-"
		}
		if s.Failures > 0 {
			lastErr = s.ErrorClass + ": " + oneLine(s.LastError)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s ago\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Tenant, s.State, FormatDuration(now.Sub(s.TurnEnded)),
			FormatDuration(s.Took()), s.Published, pending, oldest, quarantined, s.Failures, backoff, detection, lastErr)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d tenants, %d failing, %d sweep-only (their writes wait for the sweep), %d without a recorded turn\n",
		len(ft.Tenants), ft.Failing, ft.SweepOnly, ft.Unrecorded)
	return nil
}

// fleetTurns reads the registered tenants and the relay's view of them from the control
// database: the reader of `sluice fleet status` and of the console's fleet page.
func (a *app) fleetTurns(ctx context.Context, src fleetSource) (FleetTurns, error) {
	tenants, err := a.fleetTenants(ctx, src)
	if err != nil {
		return FleetTurns{}, err
	}
	pool, err := a.registryDB(ctx, src)
	if err != nil {
		return FleetTurns{}, err
	}
	defer pool.Close()
	return ReadFleetTurns(ctx, pool, tenants)
}

func (a *app) fleetStatusCommand(src *fleetSource) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the fleet relay's own view of each tenant: last turn, backlog, failures, sweep-only tenants",
		Long: `Show what the fleet relay recorded of each registered tenant in the control database's
` + fleet.TurnStateTable + ` table (created by sluice fleet init; the relay writes a tenant's row
at the end of a turn that failed or changed its state at once, a busy tenant's at most every 10
seconds, never for an idle tenant's sweep that found nothing): its state, its last recorded
turn (how long ago, how long it took, the rows published since the record before), the
backlog the relay last read, its failed turns in a row
with the last error's class and text and when its backoff ends, and how the relay's activity
poll sees its database: "sweep-only" tenants are those it cannot see, whose writes wait for
their sweep (give them their own server name: docs/fleet.md).

Failing tenants come first, then sweep-only ones, then the oldest backlog. It exits non-zero
when a tenant is failing. "sluice status --fleet" reads the tenant databases themselves instead.`,
		Example: `  sluice fleet status --fleet-registry postgres://sluice@control/fleet
  sluice fleet status --json | jq -r '.[] | select(.sweep_only) | .tenant'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ft, err := a.fleetTurns(cmd.Context(), *src)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.io.Out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(ft.json()); err != nil {
					return err
				}
			} else if err := printFleetTurns(a.io.Out, ft, time.Now()); err != nil {
				return err
			}
			if ft.Failing > 0 {
				return fmt.Errorf("fleet status: %d of %d tenants failing", ft.Failing, len(ft.Tenants))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&src.tenantsFile, "fleet-tenants", "",
		fmt.Sprintf("`FILE` holding tenants as a JSON array, besides the registry's; \"-\" reads stdin (default $%s)", lambdaenv.FleetTenants))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return cmd
}
