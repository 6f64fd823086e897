package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/migrations"
)

func (a *app) migrateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate [up|down|status]",
		Short: "Apply, roll back or show the embedded schema migrations",
		Long: `Apply, roll back or show the schema migrations embedded in this binary (outbox_event,
inbox_event). With no subcommand, migrate runs "up". Migrating takes an advisory lock, so it is
safe to run while Lambdas migrate too.`,
		Example: `  sluice migrate            # same as: sluice migrate up
  sluice migrate status
  sluice migrate down --to 1 --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.migrateUp(cmd) },
	}
	up := &cobra.Command{
		Use:     "up",
		Short:   "Apply every embedded migration the database lacks",
		Example: `  DATABASE_URL=postgres://sluice@localhost/app sluice migrate up`,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return a.migrateUp(cmd) },
	}
	var (
		to  int
		yes bool
	)
	down := &cobra.Command{
		Use:   "down",
		Short: "Roll back migrations (one step, or to --to N); drops tables and their rows",
		Long: `Roll back schema migrations: one step by default, or down to version --to (0 removes every
sluice table). Rolling back drops tables with their rows, so it asks for confirmation unless --yes;
without a terminal and without --yes it refuses.`,
		Example: `  sluice migrate down            # one step, asks first
  sluice migrate down --to 0 --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withConn(cmd.Context(), func(ctx context.Context, conn *pgx.Conn) error {
				cur, err := migrations.Current(ctx, conn)
				if err != nil {
					return err
				}
				target := cur - 1
				if cmd.Flags().Changed("to") {
					if to < 0 || int32(to) > migrations.Latest() {
						return usagef("--to %d is not a version between 0 and %d", to, migrations.Latest())
					}
					target = int32(to)
				}
				if cur == 0 || target >= cur {
					fmt.Fprintf(a.io.Out, "nothing to roll back: the database is at version %d\n", cur)
					return nil
				}
				if !yes {
					if err := a.confirm(cmd, fmt.Sprintf("Roll back from version %d to %d, dropping tables and their rows?", cur, target),
						"refusing to roll back"); err != nil {
						return err
					}
				}
				if err := migrations.To(ctx, conn, target); err != nil {
					return err
				}
				fmt.Fprintf(a.io.Out, "rolled back from version %d to %d\n", cur, target)
				return nil
			})
		},
	}
	down.Flags().IntVar(&to, "to", 0, "version to roll back to (default: one step down)")
	down.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	status := &cobra.Command{
		Use:     "status",
		Short:   "Show the database's schema version and the embedded migrations",
		Example: `  sluice migrate status`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withConn(cmd.Context(), func(ctx context.Context, conn *pgx.Conn) error {
				cur, err := migrations.Current(ctx, conn)
				if err != nil {
					return err
				}
				ms, err := migrations.List()
				if err != nil {
					return err
				}
				fmt.Fprintf(a.io.Out, "version %d of %d\n", cur, migrations.Latest())
				tw := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "VERSION\tNAME\tSTATE")
				for _, m := range ms {
					state := "pending"
					if m.Version <= cur {
						state = "applied"
					}
					fmt.Fprintf(tw, "%04d\t%s\t%s\n", m.Version, m.Name, state)
				}
				return tw.Flush()
			})
		},
	}
	cmd.AddCommand(up, down, status)
	return cmd
}

func (a *app) migrateUp(cmd *cobra.Command) error {
	return a.withConn(cmd.Context(), func(ctx context.Context, conn *pgx.Conn) error {
		before, err := migrations.Current(ctx, conn)
		if err != nil {
			return err
		}
		if err := migrations.Up(ctx, conn); err != nil {
			return err
		}
		if before == migrations.Latest() {
			fmt.Fprintf(a.io.Out, "already at version %d\n", before)
		} else {
			fmt.Fprintf(a.io.Out, "migrated from version %d to %d\n", before, migrations.Latest())
		}
		return nil
	})
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
