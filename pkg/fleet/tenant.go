package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tenant is one database of the fleet.
type Tenant struct {
	// Name identifies the tenant: 1 to 63 characters of a-z, 0-9, '-' and '_', starting with
	// a letter or digit. It is carried on every message as outbox.TenantHeader and is the
	// metrics' tenant dimension. Required, unique in the fleet.
	Name string `json:"name"`
	// DatabaseURL is the tenant database's connection URL. One of DatabaseURL and SecretARN is
	// required.
	DatabaseURL string `json:"databaseUrl,omitempty"`
	// SecretARN names an RDS Secrets Manager secret of the tenant database (read by
	// Config.Connect; the relay Lambda's resolves it through pkg/lambdaenv).
	SecretARN string `json:"secretArn,omitempty"`
	// Server names the PostgreSQL server the database is on: tenants of one server share its
	// connection budget. Defaults to DatabaseURL's host:port; required with SecretARN.
	Server string `json:"server,omitempty"`
	// Weight bounds the tenant's share: its relay runs Weight × Relay.Pipelines pipelines (at
	// most 16) on as many connections and one more, and its turn lasts Weight × Config.Turn
	// when others wait. 1 to 100; defaults to 1.
	Weight int `json:"weight,omitempty"`
}

// MaxWeight is the largest Tenant.Weight.
const MaxWeight = 100

var tenantName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// CheckName returns why name cannot be a tenant's name, or nil (the CDK constructs refuse at
// synthesis what the relay would at run time).
func CheckName(name string) error {
	if !tenantName.MatchString(name) {
		return fmt.Errorf("tenant name %q: want 1 to 63 characters of a-z, 0-9, '-' and '_', starting with a letter or digit", name)
	}
	return nil
}

// withDefaults returns t with its Weight and Server filled, or an error naming what is wrong.
func (t Tenant) withDefaults() (Tenant, error) {
	if err := CheckName(t.Name); err != nil {
		return t, err
	}
	if (t.DatabaseURL == "") == (t.SecretARN == "") {
		return t, fmt.Errorf("tenant %s: set exactly one of DatabaseURL and SecretARN", t.Name)
	}
	if t.Weight == 0 {
		t.Weight = 1
	}
	if t.Weight < 1 || t.Weight > MaxWeight {
		return t, fmt.Errorf("tenant %s: weight %d is outside 1 to %d", t.Name, t.Weight, MaxWeight)
	}
	if t.Server == "" {
		if t.DatabaseURL == "" {
			return t, fmt.Errorf("tenant %s: a tenant given by SecretARN needs Server (its database server's name)", t.Name)
		}
		cfg, err := pgconn.ParseConfig(t.DatabaseURL)
		if err != nil {
			return t, fmt.Errorf("tenant %s: database URL: %w", t.Name, err)
		}
		t.Server = net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	}
	return t, nil
}

// checkTenants fills every tenant's defaults and reports every problem at once, duplicates
// included; the result is sorted by name.
func checkTenants(ts []Tenant) ([]Tenant, error) {
	var errs []error
	out := make([]Tenant, 0, len(ts))
	seen := map[string]bool{}
	for _, t := range ts {
		d, err := t.withDefaults()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[d.Name] {
			errs = append(errs, fmt.Errorf("tenant %s is listed twice", d.Name))
			continue
		}
		seen[d.Name] = true
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Tenant) int { return strings.Compare(a.Name, b.Name) })
	return out, errors.Join(errs...)
}

// Registry lists the fleet's tenant databases. A Fleet reads it every
// Config.RegistryRefresh: a tenant it lists is served from then on, one it no longer lists
// gets no more connections.
type Registry interface {
	Tenants(ctx context.Context) ([]Tenant, error)
}

// Static is a Registry of a fixed list, e.g. the stack's settings.
type Static []Tenant

// Tenants returns the list.
func (s Static) Tenants(context.Context) ([]Tenant, error) { return slices.Clone(s), nil }

// RegistryTable is the control table a [Table] registry reads; [CreateRegistryTable] creates it.
const RegistryTable = "sluice_fleet_tenant"

// registrySchema is RegistryTable's definition: a row per tenant; enabled = false keeps a
// tenant's row but stops serving it.
const registrySchema = `CREATE TABLE IF NOT EXISTS ` + RegistryTable + ` (
	name         text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
	database_url text,
	secret_arn   text,
	server       text,
	weight       int NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 100),
	enabled      boolean NOT NULL DEFAULT true,
	added_at     timestamptz NOT NULL DEFAULT now(),
	CHECK ((database_url IS NULL) <> (secret_arn IS NULL))
)`

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier runs a query: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// CreateRegistryTable creates RegistryTable in the control database when it does not exist.
func CreateRegistryTable(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, registrySchema); err != nil {
		return fmt.Errorf("create %s: %w", RegistryTable, err)
	}
	return nil
}

// DefaultRegistryTimeout is Table.Timeout's default.
const DefaultRegistryTimeout = 5 * time.Second

// Table is a Registry read from RegistryTable in a control database: adding, disabling or
// deleting a row adds or removes a tenant without a deploy.
type Table struct {
	// DB is the control database.
	DB Querier
	// Timeout bounds one read, connecting included: a control database that accepts
	// connections but never answers fails the read (a Fleet keeps serving the tenants it knows
	// and those of its other registries) instead of holding it. Defaults to
	// DefaultRegistryTimeout.
	Timeout time.Duration
}

// Tenants returns the enabled rows of RegistryTable.
func (r Table) Tenants(ctx context.Context) ([]Tenant, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultRegistryTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rows, err := r.DB.Query(ctx, `SELECT name, coalesce(database_url, ''), coalesce(secret_arn, ''), coalesce(server, ''), weight
		FROM `+RegistryTable+` WHERE enabled ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("read the fleet registry %s: %w", RegistryTable, err)
	}
	ts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Tenant, error) {
		var t Tenant
		err := row.Scan(&t.Name, &t.DatabaseURL, &t.SecretARN, &t.Server, &t.Weight)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the fleet registry %s: %w", RegistryTable, err)
	}
	return ts, nil
}

// AddTenant inserts or replaces t's row in RegistryTable (enabled).
func AddTenant(ctx context.Context, db Execer, t Tenant) error {
	d, err := t.withDefaults()
	if err != nil {
		return err
	}
	_, err = db.Exec(ctx, `INSERT INTO `+RegistryTable+` (name, database_url, secret_arn, server, weight)
		VALUES ($1, nullif($2, ''), nullif($3, ''), nullif($4, ''), $5)
		ON CONFLICT (name) DO UPDATE SET database_url = excluded.database_url, secret_arn = excluded.secret_arn,
			server = excluded.server, weight = excluded.weight, enabled = true`,
		d.Name, d.DatabaseURL, d.SecretARN, t.Server, d.Weight)
	if err != nil {
		return fmt.Errorf("add tenant %s: %w", t.Name, err)
	}
	return nil
}

// RemoveTenant deletes name's row from RegistryTable; it reports whether there was one.
func RemoveTenant(ctx context.Context, db Execer, name string) (bool, error) {
	tag, err := db.Exec(ctx, `DELETE FROM `+RegistryTable+` WHERE name = $1`, name)
	if err != nil {
		return false, fmt.Errorf("remove tenant %s: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Registries is a Registry of several: the tenants of each, in order (a name listed twice is
// reported and served once, from the first).
type Registries []Registry

// Tenants returns every registry's tenants; when some cannot be read, it returns the others'
// with the errors (a Fleet then adds what it got and removes nothing).
func (rs Registries) Tenants(ctx context.Context) ([]Tenant, error) {
	var (
		all  []Tenant
		errs []error
	)
	for _, r := range rs {
		ts, err := r.Tenants(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		all = append(all, ts...)
	}
	return all, errors.Join(errs...)
}
