package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/fleet"
)

// FleetMigrateOptions configure MigrateFleet.
type FleetMigrateOptions struct {
	// Open opens a tenant's database; MigrateFleet closes the pool. Required.
	Open func(ctx context.Context, t fleet.Tenant) (*pgxpool.Pool, error)
	// From is the first tenant to migrate, in name order; those before it are not touched.
	// Defaults to the first tenant.
	From string
	// DryRun reads each tenant's version and changes nothing. Defaults to false.
	DryRun bool
	// Parallel is how many tenants are migrated at once, 1 to MaxFleetParallel. Defaults to 1.
	Parallel int
	// Progress is called as each tenant is done, one call at a time, with how many are done
	// of Total. Defaults to nil.
	Progress func(done, total int, m TenantMigration)
}

// TenantMigration is one tenant's migration: its version before and after, or why it failed.
type TenantMigration struct {
	Tenant   string `json:"tenant"`
	From     int32  `json:"from"`
	To       int32  `json:"to"`
	Error    string `json:"error,omitempty"`
	Migrated bool   `json:"migrated"` // true when migrations were applied (or would be, in a dry run)
}

// FleetMigrateResult is a fleet's migration, tenant by tenant in name order.
type FleetMigrateResult struct {
	// Latest is the version every tenant is migrated to.
	Latest int32 `json:"latest"`
	// Total is the number of tenants from From on.
	Total int `json:"total"`
	// Tenants are those done, in name order.
	Tenants []TenantMigration `json:"tenants"`
	// NotStarted are the tenants an interruption left alone, in name order.
	NotStarted []string `json:"not_started,omitempty"`
}

// Failed lists the tenants whose migration failed, in name order.
func (r FleetMigrateResult) Failed() []string {
	var out []string
	for _, m := range r.Tenants {
		if m.Error != "" {
			out = append(out, m.Tenant)
		}
	}
	return out
}

// MigrateFleet applies the embedded migrations to each tenant's database in name order, as
// MigrateUp does for one database (under its advisory lock). A tenant already at the latest
// version costs a connection and a read of its version, so a re-run resumes where the last one failed or
// was interrupted. A tenant that fails is recorded and the others are still migrated; the
// error then names the failed tenants. When ctx ends no further tenant starts and those under
// way finish: the error wraps ErrInterrupted and the result lists the tenants not started.
func MigrateFleet(ctx context.Context, tenants []fleet.Tenant, opts FleetMigrateOptions) (FleetMigrateResult, error) {
	if opts.Open == nil {
		return FleetMigrateResult{}, errors.New("cli: FleetMigrateOptions.Open is required")
	}
	if opts.Parallel == 0 {
		opts.Parallel = 1
	}
	if opts.Parallel < 1 || opts.Parallel > MaxFleetParallel {
		return FleetMigrateResult{}, usagef("--parallel %d is not between 1 and %d", opts.Parallel, MaxFleetParallel)
	}
	tenants, err := tenantsFrom(tenants, opts.From)
	if err != nil {
		return FleetMigrateResult{}, err
	}
	res := FleetMigrateResult{Latest: migrations.Latest(), Total: len(tenants)}
	byIndex := make([]*TenantMigration, len(tenants))
	started := forEachTenant(ctx, tenants, opts.Parallel,
		func(ctx context.Context, t fleet.Tenant) TenantMigration {
			// A migration under way finishes when ctx ends (Ctrl-C): only new tenants stop.
			return migrateTenant(context.WithoutCancel(ctx), t, opts)
		},
		func(k, i int, m TenantMigration) {
			byIndex[i] = &m
			if opts.Progress != nil {
				opts.Progress(k, len(tenants), m)
			}
		})
	for _, m := range byIndex[:started] {
		res.Tenants = append(res.Tenants, *m)
	}
	for _, t := range tenants[started:] {
		res.NotStarted = append(res.NotStarted, t.Name)
	}
	if len(res.NotStarted) > 0 {
		return res, fmt.Errorf("%w: %d of %d tenants not started (%s first); run the same command again: tenants at version %d are skipped",
			ErrInterrupted, len(res.NotStarted), res.Total, res.NotStarted[0], res.Latest)
	}
	if failed := res.Failed(); len(failed) > 0 {
		return res, fmt.Errorf("%d of %d tenants failed: %s; run the same command again once fixed: tenants at version %d are skipped",
			len(failed), res.Total, strings.Join(failed, ", "), res.Latest)
	}
	return res, nil
}

// tenantsFrom sorts tenants by name and returns those from the one named from on (all of
// them when from is empty).
func tenantsFrom(tenants []fleet.Tenant, from string) ([]fleet.Tenant, error) {
	tenants = slices.SortedFunc(slices.Values(tenants), func(x, y fleet.Tenant) int { return strings.Compare(x.Name, y.Name) })
	if from == "" {
		return tenants, nil
	}
	i := slices.IndexFunc(tenants, func(t fleet.Tenant) bool { return t.Name == from })
	if i < 0 {
		return nil, usagef("--from %s: no tenant of that name in the fleet (see sluice fleet list)", from)
	}
	return tenants[i:], nil
}

// migrateTenant migrates one tenant's database, or reads its version in a dry run.
func migrateTenant(ctx context.Context, t fleet.Tenant, opts FleetMigrateOptions) TenantMigration {
	m := TenantMigration{Tenant: t.Name}
	fail := func(err error) TenantMigration {
		m.Error = oneLine(err.Error())
		return m
	}
	pool, err := opts.Open(ctx, t)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	c, err := pool.Acquire(ctx)
	if err != nil {
		return fail(fmt.Errorf("acquire a database connection: %w", err))
	}
	defer c.Release()
	conn := c.Conn()
	latest := migrations.Latest()
	if m.From, err = schemaVersion(ctx, conn); err != nil {
		return fail(err)
	}
	m.To = m.From
	switch {
	case m.From > latest:
		return fail(fmt.Errorf("the database is at version %d, newer than this sluice's %d: migrate it with the sluice that wrote it", m.From, latest))
	case m.From == latest:
		return m
	case opts.DryRun:
		m.To, m.Migrated = latest, true
		return m
	}
	r, err := MigrateUp(ctx, conn)
	m.From, m.To = r.From, r.To
	if err != nil {
		return fail(err)
	}
	m.Migrated = r.From != r.To
	return m
}

// schemaVersion is the database's schema version, without creating the version table in a
// database that has none (migrations.Current would), so that a dry run changes nothing.
func schemaVersion(ctx context.Context, conn *pgx.Conn) (int32, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, migrations.VersionTable).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	return migrations.Current(ctx, conn)
}

// fleetMigrateFlags are the flags of `sluice migrate --fleet` (on migrate and migrate up).
type fleetMigrateFlags struct {
	on       bool
	src      fleetSource
	from     string
	dryRun   bool
	parallel int
}

func (f *fleetMigrateFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&f.on, "fleet", false, "migrate every tenant database of the fleet (see sluice fleet) instead of --database-url")
	f.src.flags(fs)
	fs.StringVar(&f.from, "from", "", "with --fleet: start at this tenant (in name order)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "with --fleet: show each tenant's version and what would be applied; change nothing")
	fs.IntVar(&f.parallel, "parallel", 1, fmt.Sprintf("with --fleet: tenants migrated at once (1 to %d)", MaxFleetParallel))
}

const fleetMigrateHelp = `

With --fleet, every tenant database of the fleet (--fleet-registry and --fleet-tenants
standing in for the SLUICE_FLEET_* variables the fleet's Lambdas read) is migrated in name
order, --parallel at a time, printing a line per tenant as it is done: "[k/N] tenant: from →
to". A tenant that fails (unreachable, wrong password, a failing migration) is recorded and the
others are still migrated; the command then ends with exit code 1 naming the failed tenants.
Run it again to resume: a tenant already at the latest version costs only a connection and a
read of its version. --from NAME starts at a tenant; --dry-run shows what would be applied and
changes nothing (not even the version table).`

const fleetMigrateExample = `
  sluice migrate --fleet --fleet-registry postgres://sluice@control/fleet --dry-run
  sluice migrate --fleet --parallel 4
  sluice migrate --fleet --from globex`

// migrateFleet runs `sluice migrate --fleet`.
func (a *app) migrateFleet(cmd *cobra.Command, f *fleetMigrateFlags) error {
	if err := noDatabaseURL(cmd, "--fleet migrates the fleet's tenant databases"); err != nil {
		return err
	}
	ctx := cmd.Context()
	if f.parallel < 1 || f.parallel > MaxFleetParallel {
		return usagef("--parallel %d is not between 1 and %d", f.parallel, MaxFleetParallel)
	}
	tenants, err := a.fleetTenants(ctx, f.src)
	if err != nil {
		return err
	}
	open, err := a.tenantOpener(ctx, tenants)
	if err != nil {
		return err
	}
	todo, err := tenantsFrom(tenants, f.from)
	if err != nil {
		return err
	}
	verb, which := "migrating", fmt.Sprintf("%d tenants", len(todo))
	if f.dryRun {
		verb = "dry run, nothing is changed: reading"
	}
	if f.from != "" {
		which = fmt.Sprintf("%d of %d tenants (from %s)", len(todo), len(tenants), f.from)
	}
	fmt.Fprintf(a.io.Out, "%s %s to version %d, %d at a time\n", verb, which, migrations.Latest(), f.parallel)
	res, err := MigrateFleet(ctx, todo, FleetMigrateOptions{Open: open.open, DryRun: f.dryRun, Parallel: f.parallel,
		Progress: func(done, total int, m TenantMigration) {
			fmt.Fprintf(a.io.Out, "[%d/%d] %s: %s\n", done, total, m.Tenant, describeMigration(m, f.dryRun))
		}})
	if errors.Is(err, ErrUsage) {
		return err
	}
	fmt.Fprintln(a.io.Out, summarizeMigration(res, f.dryRun))
	if err != nil {
		return fmt.Errorf("migrate --fleet: %w", err)
	}
	return nil
}

// summarizeMigration is the last line of migrate --fleet: how many tenants were migrated,
// were at the latest version, failed, were not started.
func summarizeMigration(res FleetMigrateResult, dryRun bool) string {
	var migrated, current int
	for _, m := range res.Tenants {
		switch {
		case m.Error != "":
		case m.Migrated:
			migrated++
		default:
			current++
		}
	}
	verb := "migrated"
	if dryRun {
		verb = "to migrate"
	}
	s := fmt.Sprintf("%d tenants: %d %s, %d already at version %d", res.Total, migrated, verb, current, res.Latest)
	if failed := res.Failed(); len(failed) > 0 {
		s += fmt.Sprintf(", %d failed (%s)", len(failed), strings.Join(failed, ", "))
	}
	if len(res.NotStarted) > 0 {
		s += fmt.Sprintf(", %d not started (%s)", len(res.NotStarted), strings.Join(res.NotStarted, ", "))
	}
	if dryRun {
		s += "; nothing was changed"
	}
	return s
}

func describeMigration(m TenantMigration, dryRun bool) string {
	switch {
	case m.Error != "":
		return "FAILED: " + m.Error
	case !m.Migrated:
		return fmt.Sprintf("at version %d, nothing to do", m.From)
	case dryRun:
		return fmt.Sprintf("would migrate %d → %d", m.From, m.To)
	}
	return fmt.Sprintf("%d → %d", m.From, m.To)
}
