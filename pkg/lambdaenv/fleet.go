package lambdaenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/fleet"
)

// The fleet's variables: a relay (or consumer) function serves a fleet of tenant databases
// (pkg/fleet) instead of one when FleetTenants or FleetRegistrySecretARN/FleetRegistryURL is
// set.
const (
	// FleetTenants is a JSON array of fleet.Tenant ({"name","secretArn","server","weight"} or
	// {"name","databaseUrl"}): the static registry the stack's settings give.
	FleetTenants = "SLUICE_FLEET_TENANTS"
	// FleetRegistrySecretARN names the RDS secret of the control database whose
	// sluice_fleet_tenant table lists tenants added without a deploy (fleet.Table).
	FleetRegistrySecretARN = "SLUICE_FLEET_REGISTRY_SECRET_ARN"
	// FleetRegistryURL is the control database's URL; used locally and in tests. Takes
	// precedence over FleetRegistrySecretARN.
	FleetRegistryURL = "SLUICE_FLEET_REGISTRY_URL"
	// FleetServerConnections is a JSON object mapping a server name (fleet.Tenant.Server) to
	// the most connections this function may hold on it; servers it does not name get
	// FleetDefaultServerConnections.
	FleetServerConnections = "SLUICE_FLEET_SERVER_CONNECTIONS"
	// FleetDefaultServerConnections is the connection budget of a server FleetServerConnections
	// does not name. Defaults to fleet.DefaultServerConnections.
	FleetDefaultServerConnections = "SLUICE_FLEET_DEFAULT_SERVER_CONNECTIONS"
	// FleetShard is "I/N": this function serves the tenants whose fleet.ShardOf(name, N) is I,
	// so N functions (each with its own schedule) split a large fleet. Defaults to "0/1".
	FleetShard = "SLUICE_FLEET_SHARD"
	// FleetBurstPipelines is fleet.Config.BurstPipelines: the pipelines per unit of weight a
	// backlogged tenant's turn grows to on connections nobody waits for. Defaults to the
	// fleet's default (the relay's default Pipelines).
	FleetBurstPipelines = "SLUICE_FLEET_BURST_PIPELINES"
)

// FleetEnabled reports whether the environment asks for a fleet (FleetTenants,
// FleetRegistryURL or FleetRegistrySecretARN set).
func FleetEnabled(getenv Getenv) bool {
	return getenv(FleetTenants) != "" || getenv(FleetRegistryURL) != "" || getenv(FleetRegistrySecretARN) != ""
}

// FleetTenantsFrom reads FleetTenants: the static registry (empty when unset).
func FleetTenantsFrom(getenv Getenv) (fleet.Static, error) {
	raw := getenv(FleetTenants)
	if raw == "" {
		return nil, nil
	}
	var ts fleet.Static
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ts); err != nil {
		return nil, fmt.Errorf("%s: want a JSON array of {\"name\", \"databaseUrl\" or \"secretArn\", \"server\", \"weight\"}: %w", FleetTenants, err)
	}
	return ts, nil
}

// FleetRegistry returns the registry the environment describes: FleetTenants and, with
// FleetRegistryURL or FleetRegistrySecretARN, the control database's table (read on a pool of
// one connection, which close closes). secrets reads the control database's secret; as for the
// function's own pool (OpenPool), its credentials are re-read after a failed connection
// attempt, so that the control pool follows a rotation.
func FleetRegistry(ctx context.Context, getenv Getenv, secrets SecretGetter) (reg fleet.Registry, close func(), err error) {
	reg, _, close, err = fleetRegistry(ctx, getenv, secrets)
	return reg, close, err
}

// fleetRegistry is FleetRegistry, and the control database's pool (nil without one).
func fleetRegistry(ctx context.Context, getenv Getenv, secrets SecretGetter) (reg fleet.Registry, control *pgxpool.Pool, close func(), err error) {
	static, err := FleetTenantsFrom(getenv)
	if err != nil {
		return nil, nil, nil, err
	}
	url, arn := getenv(FleetRegistryURL), getenv(FleetRegistrySecretARN)
	if url == "" && arn == "" {
		return static, nil, func() {}, nil
	}
	cfg, err := secretPoolConfig(ctx, getenv, secrets, url, arn)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("fleet registry database (%s): %w", FleetRegistrySecretARN, err)
	}
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("fleet registry database: %w", err)
	}
	return fleet.Registries{static, fleet.Table{DB: pool}}, pool, pool.Close, nil
}

// FleetRegistryDatabaseURL returns the control database's URL: FleetRegistryURL, else one
// built from the RDS secret FleetRegistrySecretARN names (read with secrets, with
// DATABASE_SSLMODE and DATABASE_SSLROOTCERT as for DATABASE_SECRET_ARN); "" when neither is set.
func FleetRegistryDatabaseURL(ctx context.Context, getenv Getenv, secrets SecretGetter) (string, error) {
	if u := getenv(FleetRegistryURL); u != "" {
		return u, nil
	}
	arn := getenv(FleetRegistrySecretARN)
	if arn == "" {
		return "", nil
	}
	if secrets == nil {
		return "", errors.New("a Secrets Manager client is needed to read " + FleetRegistrySecretARN)
	}
	s, err := readSecret(ctx, secrets, arn, "")
	if err != nil {
		return "", fmt.Errorf("%s: %w", FleetRegistrySecretARN, err)
	}
	return s.url(getenv), nil
}

// FleetConnector returns the fleet's Config.Connect: a tenant's DatabaseURL as it is, or the
// host, port and dbname of its SecretARN's RDS secret with DATABASE_SSLMODE and
// DATABASE_SSLROOTCERT, as for DATABASE_SECRET_ARN (but never DATABASE_HOST and DATABASE_PORT,
// which redirect the function's own database), with DATABASE_QUERY_EXEC_MODE as PoolConfig
// applies it; a tenant's Database replaces the URL's or secret's database (fleet.Tenant.Aim),
// so that tenants of one server may share its secret. A secret is read once per ARN, however
// many tenants share it, and its
// credentials are kept as OpenPool keeps them: re-read after a failed connection attempt (at
// most every DATABASE_SECRET_REFRESH), AWSPENDING tried during a rotation; turns do not each
// call Secrets Manager. A tenant of a server FleetIAMServers lists logs in with an IAM
// authentication token per connection instead of a password, signed with the default AWS
// configuration's credentials and region (loaded on the first token).
func FleetConnector(getenv Getenv, secrets SecretGetter) func(context.Context, fleet.Tenant) (*pgxpool.Config, error) {
	return fleetConnector(getenv, secrets, lazySigner())
}

// fleetConnector is FleetConnector with the IAM token signer sign.
func fleetConnector(getenv Getenv, secrets SecretGetter, sign IAMTokenSigner) func(context.Context, fleet.Tenant) (*pgxpool.Config, error) {
	iamServers, iamErr := fleetIAMServers(getenv)
	var (
		mu    sync.Mutex
		creds = map[string]*secretCredentials{} // by secret ARN
	)
	// Each tenant's secret names its own host and port: DATABASE_HOST and DATABASE_PORT (one
	// RDS Proxy endpoint for the function's own database) must not send every tenant there.
	tenantEnv := func(k string) string {
		if k == DatabaseHost || k == DatabasePort {
			return ""
		}
		return getenv(k)
	}
	return func(ctx context.Context, t fleet.Tenant) (*pgxpool.Config, error) {
		if iamErr != nil {
			return nil, iamErr
		}
		if t.DatabaseURL != "" {
			cfg, err := PoolConfig(t.DatabaseURL, getenv)
			if err != nil {
				return nil, fmt.Errorf("tenant %s: %w", t.Name, err)
			}
			return withIAMAuth(t.Aim(cfg), t, iamServers, sign), nil
		}
		if secrets == nil {
			return nil, errors.New("a Secrets Manager client is needed to read tenant " + t.Name + "'s secret")
		}
		mu.Lock()
		c := creds[t.SecretARN]
		mu.Unlock()
		if c == nil {
			refresh, err := Duration(getenv, DatabaseSecretRefresh, DefaultSecretRefresh)
			if err != nil {
				return nil, err
			}
			s, err := readSecret(ctx, secrets, t.SecretARN, "")
			if err != nil {
				return nil, fmt.Errorf("tenant %s: %w", t.Name, err)
			}
			c = &secretCredentials{secrets: secrets, arn: t.SecretARN, minInterval: refresh, current: s, readAt: time.Now()}
			mu.Lock()
			creds[t.SecretARN] = c
			mu.Unlock()
		}
		c.mu.Lock()
		url := c.current.url(tenantEnv)
		c.mu.Unlock()
		cfg, err := PoolConfig(url, getenv)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: database URL from its secret: %w", t.Name, err)
		}
		cfg.BeforeConnect, cfg.AfterConnect = c.beforeConnect, c.afterConnect
		return withIAMAuth(t.Aim(cfg), t, iamServers, sign), nil
	}
}

// FleetConfig reads the fleet's settings: the registry (FleetRegistry) and, with a control
// database, the table of the tenants' turns there (fleet.Config.TurnState), the connection
// budgets (FleetServerConnections, FleetDefaultServerConnections), the shard (FleetShard),
// FleetBurstPipelines and the IAM servers (FleetIAMServers, checked here so that a bad value
// stops the cold start).
// Relay, MetricsRecorder and Logger are left to the caller. close closes the registry's pool.
func FleetConfig(ctx context.Context, getenv Getenv, secrets SecretGetter) (cfg fleet.Config, close func(), err error) {
	var errs []error
	if raw := getenv(FleetServerConnections); raw != "" {
		if err := json.Unmarshal([]byte(raw), &cfg.ServerConnections); err != nil {
			errs = append(errs, fmt.Errorf("%s: want a JSON object of server name to connections: %w", FleetServerConnections, err))
		}
	}
	if cfg.DefaultConnections, err = positiveInt(getenv, FleetDefaultServerConnections, fleet.DefaultServerConnections); err != nil {
		errs = append(errs, err)
	}
	if cfg.BurstPipelines, err = positiveInt(getenv, FleetBurstPipelines, 0); err != nil {
		errs = append(errs, err)
	}
	if _, err := fleetIAMServers(getenv); err != nil {
		errs = append(errs, err)
	}
	if raw := getenv(FleetShard); raw != "" {
		if _, err := fmt.Sscanf(raw, "%d/%d", &cfg.Shard, &cfg.Shards); err != nil || cfg.Shards < 1 || cfg.Shard < 0 || cfg.Shard >= cfg.Shards {
			errs = append(errs, fmt.Errorf("%s %q: want I/N with 0 ≤ I < N", FleetShard, raw))
		}
	}
	if len(errs) > 0 {
		return cfg, nil, errors.Join(errs...)
	}
	cfg.Connect = FleetConnector(getenv, secrets)
	var control *pgxpool.Pool
	cfg.Registry, control, close, err = fleetRegistry(ctx, getenv, secrets)
	if control != nil {
		cfg.TurnState = control // each tenant's turns, for sluice fleet status and the console
	}
	return cfg, close, err
}
