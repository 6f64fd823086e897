package lambdaenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/inbox"
)

func TestTenantPoolSettingsReadBothBoundsAndNameEveryProblem(t *testing.T) {
	t.Parallel()
	cfg, err := ConsumerTenantPoolsConfig(env(nil))
	require.NoError(t, err)
	require.Equal(t, inbox.TenantPoolsConfig{MaxConnsPerTenant: DefaultConsumerTenantMaxConns, MaxConns: DefaultConsumerFleetMaxConns}, cfg)
	cfg, err = ConsumerTenantPoolsConfig(env(map[string]string{ConsumerTenantMaxConns: " 3 ", ConsumerFleetMaxConns: "30"}))
	require.NoError(t, err)
	require.Equal(t, inbox.TenantPoolsConfig{MaxConnsPerTenant: 3, MaxConns: 30}, cfg)

	_, err = ConsumerTenantPoolsConfig(env(map[string]string{ConsumerTenantMaxConns: "0", ConsumerFleetMaxConns: "many"}))
	require.ErrorContains(t, err, ConsumerTenantMaxConns+` must be an integer between 1 and 100, got "0"`)
	require.ErrorContains(t, err, ConsumerFleetMaxConns+` must be an integer between 1 and 10000, got "many"`)
	_, err = ConsumerTenantPoolsConfig(env(map[string]string{ConsumerTenantMaxConns: "8", ConsumerFleetMaxConns: "4"}))
	require.ErrorContains(t, err, ConsumerTenantMaxConns+" (8) must not exceed "+ConsumerFleetMaxConns+" (4)")
}

// secretsByARN serves one RDS secret per ARN.
type secretsByARN map[string]string

func (s secretsByARN) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	v, ok := s[aws.ToString(in.SecretId)]
	if !ok {
		return nil, fmt.Errorf("ResourceNotFoundException: %s", aws.ToString(in.SecretId))
	}
	return &secretsmanager.GetSecretValueOutput{SecretString: aws.String(v), VersionId: aws.String("v1")}, nil
}

// A fleet consumer's tenants come from the control database's registry table: a tenant given
// by URL and one given by its RDS secret each open on their own database, a tenant added to
// the table later is served without a restart, and a tenant nobody registered is
// ErrUnknownTenant.
func TestTenantRegistryTableResolvesURLsSecretsAndLaterTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	controlURL := testdb.EmptyURL(t)
	control, err := pgxpool.New(ctx, controlURL)
	require.NoError(t, err)
	defer control.Close()
	require.NoError(t, fleet.CreateRegistryTable(ctx, control))
	acme, globex, initech := testdb.EmptyURL(t), testdb.EmptyURL(t), testdb.EmptyURL(t)
	require.NoError(t, fleet.AddTenant(ctx, control, fleet.Tenant{Name: "acme", DatabaseURL: acme}))
	require.NoError(t, fleet.AddTenant(ctx, control, fleet.Tenant{Name: "globex", SecretARN: "arn:globex", Server: "test"}))
	secrets := secretsByARN{"arn:globex": secretJSON(t, globex, "postgres")}

	getenv := env(map[string]string{FleetRegistryURL: controlURL, DatabaseSSLMode: "disable", ConsumerTenantMaxConns: "1"})
	require.True(t, FleetEnabled(getenv))
	f, err := openConsumerFleet(ctx, getenv, secrets, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer f.Close()
	database := func(tenant string) (string, error) {
		var name string
		err := f.Pools.WithTenant(ctx, tenant, func(db *pgxpool.Pool) error {
			return db.QueryRow(ctx, `SELECT current_database()`).Scan(&name)
		})
		return name, err
	}
	for tenant, u := range map[string]string{"acme": acme, "globex": globex} {
		got, err := database(tenant)
		require.NoError(t, err, tenant)
		require.Equal(t, dbName(t, u), got, "tenant %s opens on its own database", tenant)
	}
	_, err = database("initech")
	require.ErrorIs(t, err, inbox.ErrUnknownTenant)

	require.NoError(t, fleet.AddTenant(ctx, control, fleet.Tenant{Name: "initech", DatabaseURL: initech}))
	testwait.Until(t, "a tenant added to the registry is served", func() bool {
		got, err := database("initech")
		return err == nil && got == dbName(t, initech)
	})
}

func dbName(t *testing.T, u string) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(u)
	require.NoError(t, err)
	return cfg.ConnConfig.Database
}

// flakyRegistry lists its tenants, or fails with err when set.
type flakyRegistry struct {
	tenants []fleet.Tenant
	err     error
	reads   int
}

func (r *flakyRegistry) Tenants(context.Context) ([]fleet.Tenant, error) {
	r.reads++
	return r.tenants, r.err
}

// The registry is read again when stale or a second after a miss; when it cannot be read, the
// tenants it listed before are still served (a registry outage stops no tenant), and a tenant it
// never listed fails with the registry's error, not as unknown, so its messages are retried.
func TestTenantResolverReadsTheRegistryWhenStaleAndSurvivesItsOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	reg := &flakyRegistry{tenants: []fleet.Tenant{{Name: "acme", DatabaseURL: "postgres://db/acme"}, {Name: "acme", DatabaseURL: "postgres://db/second"}}}
	r := &tenantResolver{registry: reg, now: func() time.Time { return now },
		connect: func(_ context.Context, t fleet.Tenant) (*pgxpool.Config, error) {
			return pgxpool.ParseConfig(t.DatabaseURL)
		}}
	db := func(name string) (string, error) {
		cfg, err := r.resolve(ctx, name)
		if err != nil {
			return "", err
		}
		return cfg.ConnConfig.Database, nil
	}
	got, err := db("acme")
	require.NoError(t, err)
	require.Equal(t, "acme", got, "a tenant listed twice is served from the first")
	_, err = db("globex")
	require.ErrorIs(t, err, inbox.ErrUnknownTenant)
	require.Equal(t, 1, reg.reads, "a miss within a second of the last read reads nothing")

	reg.tenants = append(reg.tenants, fleet.Tenant{Name: "globex", DatabaseURL: "postgres://db/globex"})
	now = now.Add(tenantMissRefresh)
	got, err = db("globex")
	require.NoError(t, err)
	require.Equal(t, "globex", got, "a tenant added is found a second after a miss")

	reg.err = errors.New("control database down")
	now = now.Add(fleet.DefaultRegistryRefresh)
	got, err = db("acme")
	require.NoError(t, err, "known tenants are served through a registry outage")
	require.Equal(t, "acme", got)
	now = now.Add(tenantMissRefresh)
	_, err = db("initech")
	require.ErrorContains(t, err, "control database down")
	require.NotErrorIs(t, err, inbox.ErrUnknownTenant, "retried, not taken for unknown")
}

// countingSecrets counts the reads of each ARN.
type countingSecrets struct {
	secretsByARN
	mu    sync.Mutex
	reads map[string]int
}

func (s *countingSecrets) GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, o ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	s.mu.Lock()
	s.reads[aws.ToString(in.SecretId)]++
	s.mu.Unlock()
	return s.secretsByARN.GetSecretValue(ctx, in, o...)
}

// Tenants of one server share its secret, each naming only its database (the registry
// table's database column): each opens on its own database, and the secret is read once.
func TestTenantsOfOneServerShareItsSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	controlURL := testdb.EmptyURL(t)
	control, err := pgxpool.New(ctx, controlURL)
	require.NoError(t, err)
	defer control.Close()
	require.NoError(t, fleet.CreateRegistryTable(ctx, control))
	acme, globex := testdb.EmptyURL(t), testdb.EmptyURL(t)
	for name, u := range map[string]string{"acme": acme, "globex": globex} {
		require.NoError(t, fleet.AddTenant(ctx, control, fleet.Tenant{Name: name, SecretARN: "arn:server-1", Server: "server-1", Database: dbName(t, u)}))
	}
	secrets := &countingSecrets{secretsByARN: secretsByARN{"arn:server-1": secretJSON(t, controlURL, "postgres")}, reads: map[string]int{}}

	getenv := env(map[string]string{FleetRegistryURL: controlURL, DatabaseSSLMode: "disable", ConsumerTenantMaxConns: "1"})
	f, err := openConsumerFleet(ctx, getenv, secrets, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer f.Close()
	for tenant, u := range map[string]string{"acme": acme, "globex": globex} {
		var got string
		require.NoError(t, f.Pools.WithTenant(ctx, tenant, func(db *pgxpool.Pool) error {
			return db.QueryRow(ctx, `SELECT current_database()`).Scan(&got)
		}), tenant)
		require.Equal(t, dbName(t, u), got, "tenant %s opens on its own database with the server's secret", tenant)
	}
	require.Equal(t, 1, secrets.reads["arn:server-1"], "one secret for the server, read once")
}
