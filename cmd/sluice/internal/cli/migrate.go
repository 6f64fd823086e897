package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/migrations"
)

func (a *app) migrateCommand() *cobra.Command {
	var fleetFlags fleetMigrateFlags
	cmd := &cobra.Command{
		Use:   "migrate [up|down|status]",
		Short: "Apply, roll back or show the embedded schema migrations",
		Long: `Apply, roll back or show the schema migrations embedded in this binary (outbox_event,
inbox_event). With no subcommand, migrate runs "up". Migrating takes an advisory lock, so it is
safe to run while Lambdas migrate too.` + fleetMigrateHelp,
		Example: `  sluice migrate            # same as: sluice migrate up
  sluice migrate status
  sluice migrate down --to 1 --yes` + fleetMigrateExample,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.migrateUpOrFleet(cmd, &fleetFlags) },
	}
	fleetFlags.register(cmd.Flags())
	up := &cobra.Command{
		Use:     "up",
		Short:   "Apply every embedded migration the database lacks (--fleet: every tenant database's)",
		Long:    `Apply every embedded migration the database lacks.` + fleetMigrateHelp,
		Example: `  DATABASE_URL=postgres://sluice@localhost/app sluice migrate up` + fleetMigrateExample,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return a.migrateUpOrFleet(cmd, &fleetFlags) },
	}
	fleetFlags.register(up.Flags())
	var (
		to int
		g  guard
	)
	down := &cobra.Command{
		Use:   "down",
		Short: "Roll back migrations (one step, or to --to N); drops tables and their rows",
		Long: `Roll back schema migrations: one step by default, or down to version --to (0 removes every
sluice table). Rolling back drops tables with their rows, so it first prints the versions it would roll back
across; --dry-run stops there. On a terminal it asks for confirmation; --yes confirms for
scripts; without a terminal and without --yes it refuses.`,
		Example: `  sluice migrate down            # one step, asks first
  sluice migrate down --to 0 --dry-run
  sluice migrate down --to 0 --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := MigrateDownOptions{}
			if cmd.Flags().Changed("to") {
				if to < 0 || int32(to) > migrations.Latest() {
					return usagef("--to %d is not a version between 0 and %d", to, migrations.Latest())
				}
				v := int32(to)
				opts.To = &v
			}
			opts.Confirm = func(from, to int32) error {
				a.printPlan(g, "migrate down", map[string]any{"from": from, "to": to}, func(w io.Writer) {
					fmt.Fprintf(w, "Would roll back from version %d to %d, dropping tables and their rows\n", from, to)
				})
				return a.proceedOrStop(g, fmt.Sprintf("Roll back from version %d to %d, dropping tables and their rows?", from, to), "roll back")
			}
			return a.withConn(cmd.Context(), func(ctx context.Context, conn *pgx.Conn) error {
				res, err := MigrateDown(ctx, conn, opts)
				if err != nil {
					return ignoreDryRun(err)
				}
				if g.json {
					emitJSON(a.io.Out, map[string]any{"event": "result", "op": "migrate down", "from": res.From, "to": res.To})
					return nil
				}
				if res.From == res.To {
					fmt.Fprintf(a.io.Out, "nothing to roll back: the database is at version %d\n", res.From)
				} else {
					fmt.Fprintf(a.io.Out, "rolled back from version %d to %d\n", res.From, res.To)
				}
				return nil
			})
		},
	}
	down.Flags().IntVar(&to, "to", 0, "version to roll back to (default: one step down)")
	g.flags(down, "be rolled back")
	status := &cobra.Command{
		Use:     "status",
		Short:   "Show the database's schema version and the embedded migrations",
		Example: `  sluice migrate status`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withConn(cmd.Context(), func(ctx context.Context, conn *pgx.Conn) error {
				st, err := ReadMigrations(ctx, conn)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.io.Out, "version %d of %d\n", st.Current, st.Latest)
				tw := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "VERSION\tNAME\tSTATE")
				for _, m := range st.Migrations {
					state := "pending"
					if m.Applied {
						state = "applied"
					}
					fmt.Fprintf(tw, "%04d\t%s\t%s\n", m.Version, m.Name, state)
				}
				return tw.Flush()
			})
		},
	}
	cmd.AddCommand(up, down, status)
	const why = "applies the embedded migrations the database lacks: it adds tables, columns and indexes and removes no row; the Lambdas run it at every cold start (--fleet --dry-run shows what it would apply)"
	unguarded(cmd, why)
	unguarded(up, why)
	readsOnly(status)
	return cmd
}

// migrateUpOrFleet runs `sluice migrate [up]`, on one database or with --fleet on every
// tenant's; the fleet's flags without --fleet are refused rather than ignored.
func (a *app) migrateUpOrFleet(cmd *cobra.Command, f *fleetMigrateFlags) error {
	if f.on {
		return a.migrateFleet(cmd, f)
	}
	for _, name := range []string{"from", "dry-run", "parallel", "fleet-registry", "fleet-tenants"} {
		if cmd.Flags().Changed(name) {
			return usagef("--%s needs --fleet", name)
		}
	}
	return a.migrateUp(cmd)
}

func (a *app) migrateUp(cmd *cobra.Command) error {
	return a.withConn(cmd.Context(), func(ctx context.Context, conn *pgx.Conn) error {
		res, err := MigrateUp(ctx, conn)
		if err != nil {
			return err
		}
		if res.From == res.To {
			fmt.Fprintf(a.io.Out, "already at version %d\n", res.From)
		} else {
			fmt.Fprintf(a.io.Out, "migrated from version %d to %d\n", res.From, res.To)
		}
		return nil
	})
}

// MigrateResult is the schema version before and after a migration.
type MigrateResult struct {
	From, To int32
}

// MigrateUp applies every embedded migration the database lacks (under an advisory lock, so it
// is safe next to Lambdas migrating too).
func MigrateUp(ctx context.Context, conn *pgx.Conn) (MigrateResult, error) {
	before, err := migrations.Current(ctx, conn)
	if err != nil {
		return MigrateResult{}, err
	}
	if err := migrations.Up(ctx, conn); err != nil {
		return MigrateResult{From: before, To: before}, err
	}
	return MigrateResult{From: before, To: migrations.Latest()}, nil
}

// MigrateDownOptions configure MigrateDown.
type MigrateDownOptions struct {
	// To is the version to roll back to (0 removes every sluice table). Defaults to one step down.
	To *int32
	// Confirm is asked before tables are dropped; an error stops the roll-back. Defaults to nil:
	// no confirmation.
	Confirm func(from, to int32) error
}

// MigrateDown rolls the schema back, dropping tables with their rows. It does nothing (From ==
// To) when the database is already at or below the target.
func MigrateDown(ctx context.Context, conn *pgx.Conn, opts MigrateDownOptions) (MigrateResult, error) {
	if opts.To != nil && (*opts.To < 0 || *opts.To > migrations.Latest()) {
		return MigrateResult{}, usagef("--to %d is not a version between 0 and %d", *opts.To, migrations.Latest())
	}
	cur, err := migrations.Current(ctx, conn)
	if err != nil {
		return MigrateResult{}, err
	}
	target := cur - 1
	if opts.To != nil {
		target = *opts.To
	}
	if cur == 0 || target >= cur {
		return MigrateResult{From: cur, To: cur}, nil
	}
	if opts.Confirm != nil {
		if err := opts.Confirm(cur, target); err != nil {
			return MigrateResult{From: cur, To: cur}, err
		}
	}
	if err := migrations.To(ctx, conn, target); err != nil {
		return MigrateResult{From: cur, To: cur}, err
	}
	return MigrateResult{From: cur, To: target}, nil
}

// MigrationState is one embedded migration and whether the database has it.
type MigrationState struct {
	Version int32
	Name    string
	Applied bool
}

// MigrationStatus is the database's schema version and the embedded migrations.
type MigrationStatus struct {
	Current, Latest int32
	Migrations      []MigrationState
}

// ReadMigrations reads the database's schema version next to the embedded migrations.
func ReadMigrations(ctx context.Context, conn *pgx.Conn) (MigrationStatus, error) {
	cur, err := migrations.Current(ctx, conn)
	if err != nil {
		return MigrationStatus{}, err
	}
	ms, err := migrations.List()
	if err != nil {
		return MigrationStatus{}, err
	}
	st := MigrationStatus{Current: cur, Latest: migrations.Latest()}
	for _, m := range ms {
		st.Migrations = append(st.Migrations, MigrationState{Version: m.Version, Name: m.Name, Applied: m.Version <= cur})
	}
	return st, nil
}

// withConn runs f on one connection of the pool (migrations need a *pgx.Conn).
func (a *app) withConn(ctx context.Context, f func(context.Context, *pgx.Conn) error) error {
	pool, err := a.db(ctx)
	if err != nil {
		return err
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a database connection: %w", err)
	}
	defer c.Release()
	return f(ctx, c.Conn())
}
