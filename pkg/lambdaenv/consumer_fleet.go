package lambdaenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/inbox"
)

// A fleet consumer's settings: the consumer Lambda applies each message in its tenant's
// database (inbox.ConsumerConfig.Tenants) when FleetTenants or FleetRegistryURL /
// FleetRegistrySecretARN is set (fleet.go), instead of in DATABASE_URL's.
const (
	// ConsumerTenantMaxConns is the most connections a fleet consumer instance holds on one
	// tenant's database (inbox.TenantPoolsConfig.MaxConnsPerTenant). Defaults to
	// DefaultConsumerTenantMaxConns.
	ConsumerTenantMaxConns = "SLUICE_CONSUMER_TENANT_MAX_CONNS"
	// ConsumerFleetMaxConns is the most connections a fleet consumer instance holds on all
	// tenant databases together (inbox.TenantPoolsConfig.MaxConns): the least recently used
	// idle tenant pool closes to make room. Defaults to DefaultConsumerFleetMaxConns.
	ConsumerFleetMaxConns = "SLUICE_CONSUMER_FLEET_MAX_CONNS"
)

// Fleet consumer defaults, quoted by help texts and the CDK props.
const (
	// DefaultConsumerTenantMaxConns is SLUICE_CONSUMER_TENANT_MAX_CONNS's default.
	DefaultConsumerTenantMaxConns = inbox.DefaultMaxConnsPerTenant
	// DefaultConsumerFleetMaxConns is SLUICE_CONSUMER_FLEET_MAX_CONNS's default.
	DefaultConsumerFleetMaxConns = inbox.DefaultTenantMaxConns
)

// tenantMissRefresh is the shortest time between two reads of the registry caused by a tenant
// it did not list (a tenant added since the last read), so a flood of messages of an unknown
// tenant costs at most one read of the registry a second.
const tenantMissRefresh = time.Second

// ConsumerTenantPoolsConfig reads ConsumerTenantMaxConns and ConsumerFleetMaxConns into the
// bounds of a fleet consumer's tenant pools (without Resolve and Logger), reporting every
// problem at once.
func ConsumerTenantPoolsConfig(getenv Getenv) (inbox.TenantPoolsConfig, error) {
	cfg := inbox.TenantPoolsConfig{MaxConnsPerTenant: DefaultConsumerTenantMaxConns, MaxConns: DefaultConsumerFleetMaxConns}
	var errs []error
	for _, v := range []struct {
		name string
		max  int
		dst  *int
	}{
		{ConsumerTenantMaxConns, 100, &cfg.MaxConnsPerTenant},
		{ConsumerFleetMaxConns, 10000, &cfg.MaxConns},
	} {
		if raw := getenv(v.name); raw != "" {
			n, err := strconv.Atoi(strings.TrimSpace(raw))
			if err != nil || n < 1 || n > v.max {
				errs = append(errs, fmt.Errorf("%s must be an integer between 1 and %d, got %q", v.name, v.max, raw))
				continue
			}
			*v.dst = n
		}
	}
	if len(errs) == 0 && cfg.MaxConnsPerTenant > cfg.MaxConns {
		errs = append(errs, fmt.Errorf("%s (%d) must not exceed %s (%d)", ConsumerTenantMaxConns, cfg.MaxConnsPerTenant, ConsumerFleetMaxConns, cfg.MaxConns))
	}
	if err := errors.Join(errs...); err != nil {
		return inbox.TenantPoolsConfig{}, fmt.Errorf("fleet consumer settings: %w", err)
	}
	return cfg, nil
}

// ConsumerFleet is what a fleet consumer Lambda opens once per cold start: the tenants' pools
// and the registry they are resolved from.
type ConsumerFleet struct {
	// Pools opens each tenant's database: the consumer's inbox.ConsumerConfig.Tenants.
	Pools *inbox.TenantPools
	// Registry lists the fleet's tenants, e.g. for a Processor per tenant.
	Registry fleet.Registry
	// closeRegistry closes the control database's pool, if any.
	closeRegistry func()
}

// Close closes the tenants' pools and the registry's control database.
func (f *ConsumerFleet) Close() {
	f.Pools.Close()
	f.closeRegistry()
}

// OpenConsumerFleet reads a fleet consumer's settings (the relay's registry, FleetRegistry, and
// ConsumerTenantPoolsConfig) and returns its tenant pools: a tenant's database is opened as the
// fleet relay opens it (FleetConnector: its databaseUrl as it is, or its secretArn's RDS secret
// with DATABASE_SSLMODE and DATABASE_SSLROOTCERT, credentials re-read after a failed connection
// attempt). The registry is read again when older than fleet.DefaultRegistryRefresh, or a
// second after a miss, so a tenant added to the control table is served without a deploy. It
// returns nil, nil when FleetEnabled is false.
func OpenConsumerFleet(ctx context.Context, getenv Getenv, log *slog.Logger) (*ConsumerFleet, error) {
	if !FleetEnabled(getenv) {
		return nil, nil
	}
	secrets, err := secretsClient(ctx)
	if err != nil {
		return nil, err
	}
	return openConsumerFleet(ctx, getenv, secrets, log)
}

// openConsumerFleet is OpenConsumerFleet with the given Secrets Manager client.
func openConsumerFleet(ctx context.Context, getenv Getenv, secrets SecretGetter, log *slog.Logger) (*ConsumerFleet, error) {
	cfg, err := ConsumerTenantPoolsConfig(getenv)
	if err != nil {
		return nil, err
	}
	reg, closeReg, err := FleetRegistry(ctx, getenv, secrets)
	if err != nil {
		return nil, err
	}
	r := &tenantResolver{registry: reg, connect: FleetConnector(getenv, secrets), now: time.Now}
	cfg.Resolve, cfg.Logger = r.resolve, log
	pools, err := inbox.NewTenantPools(cfg)
	if err != nil {
		closeReg()
		return nil, err
	}
	return &ConsumerFleet{Pools: pools, Registry: reg, closeRegistry: closeReg}, nil
}

// tenantResolver resolves a tenant's database from the registry, read again when stale.
type tenantResolver struct {
	registry fleet.Registry
	connect  func(context.Context, fleet.Tenant) (*pgxpool.Config, error) // FleetConnector
	now      func() time.Time

	mu      sync.Mutex
	tenants map[string]fleet.Tenant
	readAt  time.Time
}

// resolve is inbox.TenantPoolsConfig.Resolve.
func (r *tenantResolver) resolve(ctx context.Context, name string) (*pgxpool.Config, error) {
	t, err := r.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	return r.connect(ctx, t)
}

// lookup returns the registry's entry of name, reading the registry when it is stale.
func (r *tenantResolver) lookup(ctx context.Context, name string) (fleet.Tenant, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tenants[name]
	age := r.now().Sub(r.readAt)
	if r.tenants == nil || age >= fleet.DefaultRegistryRefresh || (!ok && age >= tenantMissRefresh) {
		ts, err := r.registry.Tenants(ctx)
		fresh := make(map[string]fleet.Tenant, len(ts))
		for _, t := range ts {
			if _, dup := fresh[t.Name]; !dup { // listed twice: served from the first (fleet.Registries)
				fresh[t.Name] = t
			}
		}
		if err != nil { // not read, or partly: it adds what it read and removes nothing, as a Fleet does
			for n, t := range r.tenants {
				if _, ok := fresh[n]; !ok {
					fresh[n] = t
				}
			}
		}
		r.tenants, r.readAt = fresh, r.now()
		if t, ok = r.tenants[name]; !ok && err != nil {
			return fleet.Tenant{}, fmt.Errorf("tenant %s: %w", name, err)
		}
	}
	if !ok {
		return fleet.Tenant{}, fmt.Errorf("%w: %q is not in the fleet's registry", inbox.ErrUnknownTenant, name)
	}
	return t, nil
}
