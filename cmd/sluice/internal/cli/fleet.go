package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// fleetSource is where a fleet command finds the fleet's tenants: the flags, else the
// environment the fleet's Lambdas read (pkg/lambdaenv's SLUICE_FLEET_* variables).
type fleetSource struct {
	registryURL string // --fleet-registry: the control database's URL
	tenantsFile string // --fleet-tenants: a file holding a JSON array of tenants ("-" is stdin)
}

func (s *fleetSource) registryFlag(fs *pflag.FlagSet) {
	fs.StringVar(&s.registryURL, "fleet-registry", "",
		fmt.Sprintf("`URL` of the control database whose %s table lists the tenants (default $%s, or the RDS secret named by $%s)",
			fleet.RegistryTable, lambdaenv.FleetRegistryURL, lambdaenv.FleetRegistrySecretARN))
}

func (s *fleetSource) flags(fs *pflag.FlagSet) {
	s.registryFlag(fs)
	fs.StringVar(&s.tenantsFile, "fleet-tenants", "",
		fmt.Sprintf("`FILE` holding the tenants as a JSON array of {\"name\",\"databaseUrl\"} or {\"name\",\"secretArn\",\"server\"}; \"-\" reads stdin (default $%s, the same array)",
			lambdaenv.FleetTenants))
}

// fleetTenants lists the fleet's tenants in name order, from the registries the fleet's
// Lambdas read (lambdaenv.FleetRegistry: the static list and the control table, both when both
// are set), each flag standing in for its variable: --fleet-tenants for SLUICE_FLEET_TENANTS,
// --fleet-registry for SLUICE_FLEET_REGISTRY_URL. A tenant listed twice is taken from its
// first listing, as the relay does, with a note on stderr.
func (a *app) fleetTenants(ctx context.Context, src fleetSource) ([]fleet.Tenant, error) {
	getenv := a.io.Getenv
	if src.tenantsFile != "" || src.registryURL != "" {
		var static string
		if src.tenantsFile != "" {
			var data []byte
			var err error
			if src.tenantsFile == "-" {
				data, err = io.ReadAll(a.io.In)
			} else {
				data, err = os.ReadFile(src.tenantsFile)
			}
			if err != nil {
				return nil, usagef("--fleet-tenants: %v", err)
			}
			static = string(data)
			if strings.TrimSpace(static) == "" {
				return nil, usagef("--fleet-tenants %s is empty: want a JSON array of tenants", src.tenantsFile)
			}
			if _, err := lambdaenv.FleetTenantsFrom(func(string) string { return static }); err != nil {
				return nil, usagef("--fleet-tenants %s: %v", src.tenantsFile, err)
			}
		}
		getenv = func(k string) string {
			switch {
			case k == lambdaenv.FleetTenants && src.tenantsFile != "":
				return static
			case k == lambdaenv.FleetRegistryURL && src.registryURL != "":
				return src.registryURL
			}
			return a.io.Getenv(k)
		}
	}
	if !lambdaenv.FleetEnabled(getenv) {
		return nil, usagef("no fleet: pass --fleet-registry URL or --fleet-tenants FILE (or set $%s, $%s or $%s)",
			lambdaenv.FleetRegistryURL, lambdaenv.FleetRegistrySecretARN, lambdaenv.FleetTenants)
	}
	if _, err := lambdaenv.FleetTenantsFrom(getenv); err != nil {
		return nil, usageError{err}
	}
	var secrets lambdaenv.SecretGetter
	if getenv(lambdaenv.FleetRegistryURL) == "" && getenv(lambdaenv.FleetRegistrySecretARN) != "" {
		var err error
		if secrets, err = a.secretsClient(ctx); err != nil {
			return nil, err
		}
	}
	// The registry's pool has no timeout of its own: an unreachable control database fails
	// here rather than hanging the command.
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	reg, closeReg, err := lambdaenv.FleetRegistry(rctx, getenv, secrets)
	if err != nil {
		return nil, err
	}
	defer closeReg()
	all, err := reg.Tenants(rctx)
	if err != nil {
		return nil, registryError(err)
	}
	var ts []fleet.Tenant
	seen := map[string]bool{}
	for _, t := range all {
		if seen[t.Name] {
			fmt.Fprintf(a.io.Err, "note: tenant %s is listed twice; its first listing is used, as the relay does\n", t.Name)
			continue
		}
		seen[t.Name] = true
		ts = append(ts, t)
	}
	slices.SortStableFunc(ts, func(x, y fleet.Tenant) int { return strings.Compare(x.Name, y.Name) })
	return ts, nil
}

// registryDB opens the control database: --fleet-registry, else SLUICE_FLEET_REGISTRY_URL,
// else the RDS secret named by SLUICE_FLEET_REGISTRY_SECRET_ARN. The caller closes it.
func (a *app) registryDB(ctx context.Context, src fleetSource) (*pgxpool.Pool, error) {
	getenv := func(k string) string {
		if k == lambdaenv.FleetRegistryURL && src.registryURL != "" {
			return src.registryURL
		}
		return a.io.Getenv(k)
	}
	if getenv(lambdaenv.FleetRegistryURL) == "" && getenv(lambdaenv.FleetRegistrySecretARN) == "" {
		return nil, usagef("no fleet registry: pass --fleet-registry URL (or set $%s or $%s)",
			lambdaenv.FleetRegistryURL, lambdaenv.FleetRegistrySecretARN)
	}
	var secrets lambdaenv.SecretGetter
	if getenv(lambdaenv.FleetRegistryURL) == "" {
		c, err := a.secretsClient(ctx)
		if err != nil {
			return nil, err
		}
		secrets = c
	}
	// The control database is found as the relay finds it (lambdaenv.FleetRegistry).
	u, err := lambdaenv.FleetRegistryDatabaseURL(ctx, getenv, secrets)
	if err != nil {
		return nil, fmt.Errorf("fleet registry: %w", err)
	}
	pool, err := a.openPool(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("fleet registry: %w", err)
	}
	return pool, nil
}

// registryError names the command that creates a missing registry table (instead of the
// generic hint for a database that lacks sluice's tables).
func registryError(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42P01" {
		return fmt.Errorf("the fleet registry table %s does not exist in the control database (create it with `sluice fleet init`)", fleet.RegistryTable)
	}
	return fmt.Errorf("fleet registry: %w", err)
}

// secretsClient builds a Secrets Manager client from the invocation's AWS configuration.
func (a *app) secretsClient(ctx context.Context) (lambdaenv.SecretGetter, error) {
	if a.io.Hooks != nil && a.io.Hooks.Secrets != nil {
		return a.io.Hooks.Secrets, nil
	}
	cfg, err := a.awsConfig(ctx)
	if err != nil {
		return nil, err
	}
	return secretsmanager.NewFromConfig(cfg), nil
}

// tenantOpener opens tenant databases as the relay reaches them (lambdaenv.FleetConnector);
// it is safe for concurrent use.
type tenantOpener struct {
	connect func(context.Context, fleet.Tenant) (*pgxpool.Config, error)
}

// tenantOpener prepares what opening the tenants needs (a Secrets Manager client when one of
// them is given by a secret), before any runs concurrently.
func (a *app) tenantOpener(ctx context.Context, tenants []fleet.Tenant) (*tenantOpener, error) {
	var secrets lambdaenv.SecretGetter
	if slices.ContainsFunc(tenants, func(t fleet.Tenant) bool { return t.DatabaseURL == "" && t.SecretARN != "" }) {
		s, err := a.secretsClient(ctx)
		if err != nil {
			return nil, fmt.Errorf("tenants given by secretArn need Secrets Manager: %w", err)
		}
		secrets = s
	}
	return &tenantOpener{connect: lambdaenv.FleetConnector(a.io.Getenv, secrets)}, nil
}

// open opens and pings a pool on t's database; the caller closes it.
func (o *tenantOpener) open(ctx context.Context, t fleet.Tenant) (*pgxpool.Pool, error) {
	if (t.DatabaseURL == "") == (t.SecretARN == "") {
		return nil, errors.New("set exactly one of databaseUrl and secretArn (the relay leaves this tenant out)")
	}
	cfg, err := o.connect(ctx, t)
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		// pgx masks passwords in what it echoes only as best it can: show the cause alone.
		return nil, fmt.Errorf("database URL %s: %v", redact(t.DatabaseURL), unwrapParse(err))
	}
	if err != nil {
		return nil, err
	}
	return openPoolConfig(ctx, cfg, cfg.ConnConfig.ConnString())
}

// noDatabaseURL refuses --database-url where it would be ignored: the fleet's commands reach
// the tenants through the registry.
func noDatabaseURL(cmd *cobra.Command, what string) error {
	if f := cmd.Flags().Lookup("database-url"); f != nil && f.Changed {
		return usagef("--database-url names one database; %s", what)
	}
	return nil
}

func (a *app) fleetCommand() *cobra.Command {
	var src fleetSource
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "List, add and remove the tenant databases of a fleet (one relay deployment for many databases)",
		Long: `A fleet is a set of tenant databases served by one relay deployment. Its tenants are listed by
a static list (the stack's SLUICE_FLEET_TENANTS, or --fleet-tenants FILE here), by the control
table ` + fleet.RegistryTable + ` in a control database (--fleet-registry URL, else
$SLUICE_FLEET_REGISTRY_URL or the secret named by $SLUICE_FLEET_REGISTRY_SECRET_ARN), or by
both, as the relay reads them. A tenant added to the table is served within the relay's
registry refresh, without a deploy.

"sluice migrate --fleet" migrates every tenant and "sluice status --fleet" shows each tenant's
backlog, worst first, read from the tenant databases; "sluice fleet status" shows what the
fleet relay itself recorded of each tenant (last turn, failures, sweep-only tenants).`,
		Example: `  sluice fleet init --fleet-registry postgres://sluice@control/fleet
  sluice fleet add acme --url postgres://sluice@db-1/acme --yes
  sluice fleet add globex --secret-arn arn:aws:secretsmanager:eu-west-1:123456789012:secret:globex --server db-2 --weight 2 --yes
  sluice fleet list
  sluice fleet status
  sluice fleet remove acme --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return noDatabaseURL(cmd, "the fleet's commands use --fleet-registry (a tenant's database is --url of fleet add)")
		},
	}
	src.registryFlag(cmd.PersistentFlags())

	initCmd := &cobra.Command{
		Use:     "init",
		Short:   "Create the registry table " + fleet.RegistryTable + " and the relay's table " + fleet.TurnStateTable + " in the control database (if they do not exist)",
		Example: `  sluice fleet init --fleet-registry postgres://sluice@control/fleet`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.registryDB(ctx, src)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := fleet.CreateRegistryTable(ctx, pool); err != nil {
				return err
			}
			if err := fleet.CreateTurnStateTable(ctx, pool); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "fleet registry table %s is ready\n", fleet.RegistryTable)
			fmt.Fprintf(a.io.Out, "fleet relay's table of its tenants' turns %s is ready (sluice fleet status reads it)\n", fleet.TurnStateTable)
			return nil
		},
	}

	var (
		add      fleet.Tenant
		addGuard guard
	)
	addCmd := &cobra.Command{
		Use:   "add NAME (--url URL | --secret-arn ARN --server NAME) [--database NAME] [--weight N] [--dry-run] [--yes]",
		Short: "Add a tenant to the registry, or replace its row (and enable it)",
		Long: `Add a tenant database to the registry table, or replace the row of a tenant of that name. The
tenant's database is --url (a PostgreSQL URL) or --secret-arn (an RDS Secrets Manager secret,
read by the relay; --server then names its PostgreSQL server, whose connection budget the
tenants on it share). --database names the tenant's database on that server in place of the
one the URL or secret names: tenants of one server can then share its credentials, one URL or
one secret for all of them. --weight (1 to 100, default 1) is the tenant's share of its server.

Migrate the new tenant's database before or right after adding it: sluice migrate --fleet
--from NAME.

It first prints what it would add, or replace (the row's database before and after); --dry-run
stops there. On a terminal it asks for confirmation; --yes confirms for scripts; without a
terminal and without --yes it refuses.`,
		Example: `  sluice fleet add acme --url postgres://sluice@db-1/acme --yes
  sluice fleet add globex --secret-arn arn:aws:secretsmanager:eu-west-1:123456789012:secret:globex --server db-2 --weight 2
  sluice fleet add initech --secret-arn arn:aws:secretsmanager:eu-west-1:123456789012:secret:db-2 --server db-2 --database initech`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			add.Name = args[0]
			if (add.DatabaseURL == "") == (add.SecretARN == "") {
				return usagef("pass exactly one of --url and --secret-arn")
			}
			// What AddTenant would refuse is said before the plan, not after a confirmation.
			if err := fleet.CheckName(add.Name); err != nil {
				return err
			}
			if add.Weight != 0 && (add.Weight < 1 || add.Weight > fleet.MaxWeight) {
				return fmt.Errorf("tenant %s: weight %d is outside 1 to %d", add.Name, add.Weight, fleet.MaxWeight)
			}
			pool, err := a.registryDB(ctx, src)
			if err != nil {
				return err
			}
			defer pool.Close()
			old, found, err := registryRow(ctx, pool, add.Name)
			if err != nil {
				return err
			}
			plan := map[string]any{"tenant": add.Name, "database": tenantDatabase(add), "replaces": found}
			text := fmt.Sprintf("add tenant %s (%s)", add.Name, tenantDatabase(add))
			if found {
				plan["was"] = tenantDatabase(old)
				text = fmt.Sprintf("replace tenant %s: %s, was %s", add.Name, tenantDatabase(add), tenantDatabase(old))
			}
			a.printPlan(addGuard, "fleet add", plan, func(w io.Writer) { fmt.Fprintln(w, "Would "+text) })
			if err := a.proceedOrStop(addGuard, "Go on?", "change the fleet registry"); err != nil {
				return ignoreDryRun(err)
			}
			if err := fleet.AddTenant(ctx, pool, add); err != nil {
				return registryError(err)
			}
			if addGuard.json {
				emitJSON(a.io.Out, map[string]any{"event": "result", "op": "fleet add", "tenant": add.Name, "replaced": found})
				return nil
			}
			fmt.Fprintf(a.io.Out, "added tenant %s (%s)\n", add.Name, tenantDatabase(add))
			return nil
		},
	}
	addCmd.Flags().StringVar(&add.DatabaseURL, "url", "", "the tenant database's PostgreSQL `URL`")
	addCmd.Flags().StringVar(&add.SecretARN, "secret-arn", "", "the `ARN` of the tenant database's RDS Secrets Manager secret")
	addCmd.Flags().StringVar(&add.Server, "server", "", "the `NAME` of the tenant's PostgreSQL server (default the URL's host:port; required with --secret-arn)")
	addCmd.Flags().StringVar(&add.Database, "database", "", "the `NAME` of the tenant's database on its server, in place of the URL's or secret's (tenants sharing the server's credentials)")
	addCmd.Flags().IntVar(&add.Weight, "weight", 0, fmt.Sprintf("the tenant's share of its server, `N` from 1 to %d (default 1)", fleet.MaxWeight))
	addGuard.flags(addCmd, "be added or replaced")

	var removeGuard guard
	removeCmd := &cobra.Command{
		Use:   "remove NAME [--dry-run] [--yes]",
		Short: "Remove a tenant's row from the registry (its database is left alone)",
		Long: `Remove a tenant's row from the registry table: the relay stops serving it within its registry
refresh. The tenant's database and its rows are left alone; rows it has not published stay
pending until the tenant is added again.

It first prints the row it would remove; --dry-run stops there. On a terminal it asks for
confirmation; --yes confirms for scripts; without a terminal and without --yes it refuses.`,
		Example: `  sluice fleet remove acme --dry-run
  sluice fleet remove acme --yes`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.registryDB(ctx, src)
			if err != nil {
				return err
			}
			defer pool.Close()
			old, found, err := registryRow(ctx, pool, args[0])
			if err != nil {
				return err
			}
			if !found {
				return fmt.Errorf("no tenant %s in the fleet registry: nothing removed (see sluice fleet list)", args[0])
			}
			a.printPlan(removeGuard, "fleet remove", map[string]any{"tenant": old.Name, "database": tenantDatabase(old)}, func(w io.Writer) {
				fmt.Fprintf(w, "Would remove tenant %s (%s) from the fleet registry\n", old.Name, tenantDatabase(old))
			})
			if err := a.proceedOrStop(removeGuard, "Remove this tenant?", "remove the tenant"); err != nil {
				return ignoreDryRun(err)
			}
			if found, err = fleet.RemoveTenant(ctx, pool, args[0]); err != nil {
				return registryError(err)
			}
			if !found {
				return fmt.Errorf("no tenant %s in the fleet registry: nothing removed (see sluice fleet list)", args[0])
			}
			if removeGuard.json {
				emitJSON(a.io.Out, map[string]any{"event": "result", "op": "fleet remove", "tenant": args[0], "removed": true})
				return nil
			}
			fmt.Fprintf(a.io.Out, "removed tenant %s\n", args[0])
			return nil
		},
	}
	removeGuard.flags(removeCmd, "be removed")

	var asJSON bool
	listCmd := &cobra.Command{
		Use:   "list",
		Short: "List the fleet's tenants in name order",
		Long: `List the fleet's tenants in name order (the static list of --fleet-tenants or
$SLUICE_FLEET_TENANTS and the registry table's enabled rows), with their server, weight and
database; passwords in URLs are masked. --json prints the tenants in the format of
SLUICE_FLEET_TENANTS.`,
		Example: `  sluice fleet list
  sluice fleet list --json | jq -r '.[].name'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := a.fleetTenants(cmd.Context(), src)
			if err != nil {
				return err
			}
			if asJSON {
				for i := range ts {
					if ts[i].DatabaseURL != "" {
						ts[i].DatabaseURL = redact(ts[i].DatabaseURL)
					}
				}
				enc := json.NewEncoder(a.io.Out)
				enc.SetIndent("", "  ")
				if ts == nil {
					ts = []fleet.Tenant{}
				}
				return enc.Encode(ts)
			}
			tw := tabwriter.NewWriter(a.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TENANT\tSERVER\tWEIGHT\tDATABASE")
			for _, t := range ts {
				server, weight := t.Server, t.Weight
				if server == "" {
					server = "-"
				}
				if weight == 0 {
					weight = 1
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", t.Name, server, weight, tenantDatabase(t))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "%d tenants\n", len(ts))
			return nil
		},
	}
	listCmd.Flags().StringVar(&src.tenantsFile, "fleet-tenants", "",
		fmt.Sprintf("`FILE` holding the tenants as a JSON array; \"-\" reads stdin (default $%s)", lambdaenv.FleetTenants))
	listCmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")

	statusCmd := a.fleetStatusCommand(&src)
	cmd.AddCommand(initCmd, addCmd, removeCmd, listCmd, statusCmd)
	readsOnly(cmd, listCmd, statusCmd)
	unguarded(initCmd, "creates the registry table when it does not exist, and changes no row")
	return cmd
}

// tenantDatabase is where a tenant's database is, without its password.
// registryRow reads name's row of the registry table, enabled or not.
func registryRow(ctx context.Context, db *pgxpool.Pool, name string) (fleet.Tenant, bool, error) {
	t := fleet.Tenant{Name: name}
	err := db.QueryRow(ctx, `SELECT coalesce(database_url, ''), coalesce(secret_arn, ''), coalesce(server, ''), weight,
			coalesce(to_jsonb(r)->>'database', '')
		FROM `+fleet.RegistryTable+` r WHERE name = $1`, name).Scan(&t.DatabaseURL, &t.SecretARN, &t.Server, &t.Weight, &t.Database)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, false, nil
	}
	if err != nil {
		return t, false, registryError(fmt.Errorf("read tenant %s: %w", name, err))
	}
	return t, true, nil
}

func tenantDatabase(t fleet.Tenant) string {
	out := "secret " + t.SecretARN
	if t.DatabaseURL != "" {
		out = redact(t.DatabaseURL)
	}
	if t.Database != "" {
		out += ", database " + t.Database
	}
	return out
}
