package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
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

// tenants lists the fleet's tenants, sorted by name: --fleet-tenants, else --fleet-registry,
// else SLUICE_FLEET_REGISTRY_URL or SLUICE_FLEET_REGISTRY_SECRET_ARN, else SLUICE_FLEET_TENANTS.
func (a *app) fleetTenants(ctx context.Context, src fleetSource) ([]fleet.Tenant, error) {
	if src.tenantsFile != "" && src.registryURL != "" {
		return nil, usagef("--fleet-tenants and --fleet-registry name two fleets: pass one")
	}
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
		return parseTenants(data, "--fleet-tenants "+src.tenantsFile)
	}
	envTenants := a.io.Getenv(lambdaenv.FleetTenants)
	hasRegistry := src.registryURL != "" || a.io.Getenv(lambdaenv.FleetRegistryURL) != "" || a.io.Getenv(lambdaenv.FleetRegistrySecretARN) != ""
	if !hasRegistry {
		if envTenants == "" {
			return nil, usagef("no fleet: pass --fleet-registry URL or --fleet-tenants FILE (or set $%s, $%s or $%s)",
				lambdaenv.FleetRegistryURL, lambdaenv.FleetRegistrySecretARN, lambdaenv.FleetTenants)
		}
		return parseTenants([]byte(envTenants), "$"+lambdaenv.FleetTenants)
	}
	if src.registryURL == "" && envTenants != "" {
		return nil, usagef("both $%s and a fleet registry are set: pass --fleet-tenants or --fleet-registry to choose", lambdaenv.FleetTenants)
	}
	pool, err := a.registryDB(ctx, src)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	ts, err := fleet.Table{DB: pool}.Tenants(ctx)
	if err != nil {
		return nil, registryError(err)
	}
	slices.SortFunc(ts, func(x, y fleet.Tenant) int { return strings.Compare(x.Name, y.Name) })
	return ts, nil
}

// parseTenants reads a JSON array of tenants, the format of SLUICE_FLEET_TENANTS, and checks
// what the CLI relies on: every tenant has a name of its own and one way to reach its
// database. The rest (name syntax, weight) is the fleet's to check.
func parseTenants(data []byte, source string) ([]fleet.Tenant, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var ts []fleet.Tenant
	if err := dec.Decode(&ts); err != nil {
		return nil, usagef(`%s: want a JSON array of {"name","databaseUrl"} or {"name","secretArn","server"}: %v`, source, err)
	}
	var errs []string
	seen := map[string]bool{}
	for i, t := range ts {
		switch {
		case t.Name == "":
			errs = append(errs, fmt.Sprintf("tenant %d has no name", i+1))
		case seen[t.Name]:
			errs = append(errs, fmt.Sprintf("tenant %s is listed twice", t.Name))
		case (t.DatabaseURL == "") == (t.SecretARN == ""):
			errs = append(errs, fmt.Sprintf("tenant %s: set exactly one of databaseUrl and secretArn", t.Name))
		}
		seen[t.Name] = true
	}
	if len(errs) > 0 {
		return nil, usagef("%s: %s", source, strings.Join(errs, "; "))
	}
	slices.SortFunc(ts, func(x, y fleet.Tenant) int { return strings.Compare(x.Name, y.Name) })
	return ts, nil
}

// registryDB opens the control database: --fleet-registry, else SLUICE_FLEET_REGISTRY_URL,
// else the RDS secret named by SLUICE_FLEET_REGISTRY_SECRET_ARN. The caller closes it.
func (a *app) registryDB(ctx context.Context, src fleetSource) (*pgxpool.Pool, error) {
	u := src.registryURL
	if u == "" {
		u = a.io.Getenv(lambdaenv.FleetRegistryURL)
	}
	if u == "" {
		arn := a.io.Getenv(lambdaenv.FleetRegistrySecretARN)
		if arn == "" {
			return nil, usagef("no fleet registry: pass --fleet-registry URL (or set $%s or $%s)",
				lambdaenv.FleetRegistryURL, lambdaenv.FleetRegistrySecretARN)
		}
		secrets, err := a.secretsClient(ctx)
		if err != nil {
			return nil, err
		}
		if u, err = lambdaenv.DatabaseURLFrom(ctx, secretEnv(a.io.Getenv, arn), secrets); err != nil {
			return nil, fmt.Errorf("fleet registry: %w", err)
		}
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
	return err
}

// secretEnv is the environment with DATABASE_SECRET_ARN set to arn, as if it named the only
// database: the secret is read and turned into a URL exactly as for DATABASE_SECRET_ARN
// (lambdaenv.DatabaseURLFrom, with DATABASE_SSLMODE and DATABASE_SSLROOTCERT), except that
// DATABASE_HOST and DATABASE_PORT, which redirect the service's own database (to an RDS
// Proxy), do not apply: each secret names its own server.
func secretEnv(getenv lambdaenv.Getenv, arn string) lambdaenv.Getenv {
	return func(k string) string {
		switch k {
		case lambdaenv.DatabaseSecretARN:
			return arn
		case lambdaenv.DatabaseURL, lambdaenv.DatabaseHost, lambdaenv.DatabasePort:
			return ""
		}
		return getenv(k)
	}
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

// tenantOpener opens tenant databases; it is safe for concurrent use once built.
type tenantOpener struct {
	a       *app
	secrets lambdaenv.SecretGetter // nil when no tenant is given by a secret
}

// tenantOpener prepares what opening the tenants needs (a Secrets Manager client when one of
// them is given by a secret), before any runs concurrently.
func (a *app) tenantOpener(ctx context.Context, tenants []fleet.Tenant) (*tenantOpener, error) {
	o := &tenantOpener{a: a}
	if slices.ContainsFunc(tenants, func(t fleet.Tenant) bool { return t.SecretARN != "" }) {
		s, err := a.secretsClient(ctx)
		if err != nil {
			return nil, fmt.Errorf("tenants given by secretArn need Secrets Manager: %w", err)
		}
		o.secrets = s
	}
	return o, nil
}

// open opens and pings a pool on t's database; the caller closes it.
func (o *tenantOpener) open(ctx context.Context, t fleet.Tenant) (*pgxpool.Pool, error) {
	u := t.DatabaseURL
	if u == "" {
		var err error
		if u, err = lambdaenv.DatabaseURLFrom(ctx, secretEnv(o.a.io.Getenv, t.SecretARN), o.secrets); err != nil {
			return nil, err
		}
	}
	return o.a.openPool(ctx, u)
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
		Long: `A fleet is a set of tenant databases served by one relay deployment. Its registry is either a
static list (the stack's SLUICE_FLEET_TENANTS, or --fleet-tenants FILE here) or the control table
` + fleet.RegistryTable + ` in a control database (--fleet-registry URL, else
$SLUICE_FLEET_REGISTRY_URL or the secret named by $SLUICE_FLEET_REGISTRY_SECRET_ARN): a tenant
added there is served within the relay's registry refresh, without a deploy.

"sluice migrate --fleet" migrates every tenant and "sluice status --fleet" shows each tenant's
backlog, worst first.`,
		Example: `  sluice fleet init --fleet-registry postgres://sluice@control/fleet
  sluice fleet add acme --url postgres://sluice@db-1/acme
  sluice fleet add globex --secret-arn arn:aws:secretsmanager:eu-west-1:123456789012:secret:globex --server db-2 --weight 2
  sluice fleet list
  sluice fleet remove acme`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return noDatabaseURL(cmd, "the fleet's commands use --fleet-registry (a tenant's database is --url of fleet add)")
		},
	}
	src.registryFlag(cmd.PersistentFlags())

	initCmd := &cobra.Command{
		Use:     "init",
		Short:   "Create the registry table " + fleet.RegistryTable + " in the control database (if it does not exist)",
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
			fmt.Fprintf(a.io.Out, "fleet registry table %s is ready\n", fleet.RegistryTable)
			return nil
		},
	}

	var add fleet.Tenant
	addCmd := &cobra.Command{
		Use:   "add NAME (--url URL | --secret-arn ARN --server NAME) [--weight N]",
		Short: "Add a tenant to the registry, or replace its row (and enable it)",
		Long: `Add a tenant database to the registry table, or replace the row of a tenant of that name. The
tenant's database is --url (a PostgreSQL URL) or --secret-arn (an RDS Secrets Manager secret,
read by the relay; --server then names its PostgreSQL server, whose connection budget the
tenants on it share). --weight (1 to 100, default 1) is the tenant's share of its server.

Migrate the new tenant's database before or right after adding it: sluice migrate --fleet
--from NAME.`,
		Example: `  sluice fleet add acme --url postgres://sluice@db-1/acme
  sluice fleet add globex --secret-arn arn:aws:secretsmanager:eu-west-1:123456789012:secret:globex --server db-2 --weight 2`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			add.Name = args[0]
			if (add.DatabaseURL == "") == (add.SecretARN == "") {
				return usagef("pass exactly one of --url and --secret-arn")
			}
			pool, err := a.registryDB(ctx, src)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := fleet.AddTenant(ctx, pool, add); err != nil {
				return registryError(err)
			}
			fmt.Fprintf(a.io.Out, "added tenant %s (%s)\n", add.Name, tenantDatabase(add))
			return nil
		},
	}
	addCmd.Flags().StringVar(&add.DatabaseURL, "url", "", "the tenant database's PostgreSQL URL")
	addCmd.Flags().StringVar(&add.SecretARN, "secret-arn", "", "the RDS Secrets Manager secret of the tenant database")
	addCmd.Flags().StringVar(&add.Server, "server", "", "the tenant's PostgreSQL server (default the URL's host:port; required with --secret-arn)")
	addCmd.Flags().IntVar(&add.Weight, "weight", 0, fmt.Sprintf("the tenant's share of its server, 1 to %d (default 1)", fleet.MaxWeight))

	removeCmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a tenant's row from the registry (its database is left alone)",
		Long: `Remove a tenant's row from the registry table: the relay stops serving it within its registry
refresh. The tenant's database and its rows are left alone; rows it has not published stay
pending until the tenant is added again.`,
		Example: `  sluice fleet remove acme`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.registryDB(ctx, src)
			if err != nil {
				return err
			}
			defer pool.Close()
			found, err := fleet.RemoveTenant(ctx, pool, args[0])
			if err != nil {
				return registryError(err)
			}
			if !found {
				return fmt.Errorf("no tenant %s in the fleet registry: nothing removed (see sluice fleet list)", args[0])
			}
			fmt.Fprintf(a.io.Out, "removed tenant %s\n", args[0])
			return nil
		},
	}

	var asJSON bool
	listCmd := &cobra.Command{
		Use:   "list",
		Short: "List the fleet's tenants in name order",
		Long: `List the fleet's tenants in name order (the registry table's enabled rows, or the static list of
--fleet-tenants or $SLUICE_FLEET_TENANTS), with their server, weight and database; passwords
in URLs are masked. --json prints the tenants in the format of SLUICE_FLEET_TENANTS.`,
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

	cmd.AddCommand(initCmd, addCmd, removeCmd, listCmd)
	return cmd
}

// tenantDatabase is where a tenant's database is, without its password.
func tenantDatabase(t fleet.Tenant) string {
	if t.DatabaseURL != "" {
		return redact(t.DatabaseURL)
	}
	return "secret " + t.SecretARN
}
