package lambdaenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
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

// IsFleet reports whether the environment configures a fleet (FleetTenants, FleetRegistryURL or
// FleetRegistrySecretARN set).
func IsFleet(getenv Getenv) bool {
	return getenv(FleetTenants) != "" || getenv(FleetRegistryURL) != "" || getenv(FleetRegistrySecretARN) != ""
}

// FleetRegistry reads the fleet's registry from the environment: FleetTenants (a JSON array of
// fleet.Tenant, checked: names present and unique, exactly one of databaseUrl and secretArn
// each) or the control database's fleet.Table, at FleetRegistryURL or through the RDS secret
// FleetRegistrySecretARN (a pool of one connection, following the secret's rotation like
// OpenPool; close is its Close). Setting both a list and a control database is an error.
// secrets is needed only for a secret.
func FleetRegistry(ctx context.Context, getenv Getenv, secrets SecretGetter) (reg fleet.Registry, close func(), err error) {
	list := getenv(FleetTenants)
	url, arn := getenv(FleetRegistryURL), getenv(FleetRegistrySecretARN)
	switch {
	case list != "" && (url != "" || arn != ""):
		return nil, nil, fmt.Errorf("set %s or a control database (%s, %s), not both", FleetTenants, FleetRegistryURL, FleetRegistrySecretARN)
	case list != "":
		ts, err := parseFleetTenants(list)
		if err != nil {
			return nil, nil, err
		}
		return fleet.Static(ts), func() {}, nil
	case url == "" && arn == "":
		return nil, nil, fmt.Errorf("no fleet registry: set %s, %s or %s", FleetTenants, FleetRegistryURL, FleetRegistrySecretARN)
	}
	control, err := openPool(ctx, overlay(getenv, map[string]string{DatabaseURL: url, DatabaseSecretARN: arn, DatabaseMaxConns: "1",
		DatabaseHost: "", DatabasePort: ""}), secrets)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet registry's control database: %w", err)
	}
	return fleet.Table{DB: control}, control.Close, nil
}

// parseFleetTenants parses FleetTenants and reports every problem at once.
func parseFleetTenants(raw string) ([]fleet.Tenant, error) {
	var ts []fleet.Tenant
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ts); err != nil {
		return nil, fmt.Errorf(`%s must be a JSON array of {"name","databaseUrl"} or {"name","secretArn","server","weight"}: %w`, FleetTenants, err)
	}
	var errs []error
	seen := map[string]bool{}
	for i, t := range ts {
		switch {
		case strings.TrimSpace(t.Name) == "":
			errs = append(errs, fmt.Errorf("%s[%d]: name is required", FleetTenants, i))
		case seen[t.Name]:
			errs = append(errs, fmt.Errorf("%s: tenant %s is listed twice", FleetTenants, t.Name))
		case (t.DatabaseURL == "") == (t.SecretARN == ""):
			errs = append(errs, fmt.Errorf("%s: tenant %s: set exactly one of databaseUrl and secretArn", FleetTenants, t.Name))
		}
		seen[t.Name] = true
	}
	return ts, errors.Join(errs...)
}

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

// OpenConsumerFleet reads a fleet consumer's settings (FleetRegistry, ConsumerTenantPoolsConfig)
// and returns its tenant pools: a tenant's database is its registry entry's databaseUrl (used as
// it is) or secretArn (read like DATABASE_SECRET_ARN: DATABASE_SSLMODE and DATABASE_SSLROOTCERT
// apply, DATABASE_HOST and DATABASE_PORT do not, each tenant's secret naming its own server),
// with DATABASE_QUERY_EXEC_MODE. The registry is read again when older than
// fleet.DefaultRegistryRefresh, or a second after a miss, so a tenant added to the control
// table is served without a deploy. It returns nil, nil when IsFleet is false.
func OpenConsumerFleet(ctx context.Context, getenv Getenv, log *slog.Logger) (*ConsumerFleet, error) {
	if !IsFleet(getenv) {
		return nil, nil
	}
	return openConsumerFleet(ctx, getenv, &lazySecrets{}, log)
}

// openConsumerFleet is OpenConsumerFleet with the given Secrets Manager client.
func openConsumerFleet(ctx context.Context, getenv Getenv, secrets SecretGetter, log *slog.Logger) (*ConsumerFleet, error) {
	cfg, err := ConsumerTenantPoolsConfig(getenv)
	if err != nil {
		return nil, err
	}
	if _, err := PoolConfig("postgres://localhost", getenv); err != nil {
		return nil, err // DATABASE_QUERY_EXEC_MODE, checked before any tenant's pool opens
	}
	reg, closeReg, err := FleetRegistry(ctx, getenv, secrets)
	if err != nil {
		return nil, err
	}
	r := &tenantResolver{registry: reg, getenv: getenv, secrets: secrets, now: time.Now}
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
	getenv   Getenv
	secrets  SecretGetter
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
	g := overlay(r.getenv, map[string]string{DatabaseURL: t.DatabaseURL, DatabaseSecretARN: t.SecretARN, DatabaseHost: "", DatabasePort: ""})
	url, err := DatabaseURLFrom(ctx, g, r.secrets)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: %w", name, err)
	}
	cfg, err := PoolConfig(url, g)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: %w", name, err)
	}
	return cfg, nil
}

// lookup returns the registry's entry of name, reading the registry when it is stale.
func (r *tenantResolver) lookup(ctx context.Context, name string) (fleet.Tenant, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tenants[name]
	age := r.now().Sub(r.readAt)
	if r.tenants == nil || age >= fleet.DefaultRegistryRefresh || (!ok && age >= tenantMissRefresh) {
		ts, err := r.registry.Tenants(ctx)
		if err != nil {
			return fleet.Tenant{}, fmt.Errorf("tenant %s: %w", name, err)
		}
		r.tenants, r.readAt = make(map[string]fleet.Tenant, len(ts)), r.now()
		for _, t := range ts {
			r.tenants[t.Name] = t
		}
		t, ok = r.tenants[name]
	}
	if !ok {
		return fleet.Tenant{}, fmt.Errorf("%w: %q is not in the fleet's registry", inbox.ErrUnknownTenant, name)
	}
	return t, nil
}

// overlay returns getenv with the variables of set replaced by set's values ("" unsets one).
func overlay(getenv Getenv, set map[string]string) Getenv {
	return func(name string) string {
		if v, ok := set[name]; ok {
			return v
		}
		return getenv(name)
	}
}

// lazySecrets is a Secrets Manager client built on first use, so that a fleet given by URLs
// only needs no AWS configuration.
type lazySecrets struct {
	once   sync.Once
	client *secretsmanager.Client
	err    error
}

// GetSecretValue reads a secret, building the client first.
func (l *lazySecrets) GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	l.once.Do(func() { l.client, l.err = secretsClient(ctx) })
	if l.err != nil {
		return nil, l.err
	}
	return l.client.GetSecretValue(ctx, in, opts...)
}
