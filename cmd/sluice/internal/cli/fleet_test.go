package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/fleet"
)

// unreachableURL names a database on a port where nothing listens.
const unreachableURL = "postgres://sluice:secret@127.0.0.1:1/tenant?sslmode=disable&connect_timeout=5"

// fleetBundle is a fleet's tenants written to a --fleet-tenants file, and an environment
// without DATABASE_URL: the fleet commands never read it.
type fleetBundle struct {
	testBundle
	file string
}

func setupFleet(t *testing.T, tenants ...fleet.Tenant) *fleetBundle {
	t.Helper()
	data, err := json.Marshal(tenants)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "tenants.json")
	require.NoError(t, os.WriteFile(file, data, 0o600))
	return &fleetBundle{testBundle: testBundle{env: map[string]string{}}, file: file}
}

// schemaVersion reads a database's schema version, or -1 when it has no version table.
func schemaVersion(t *testing.T, u string) int32 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, migrations.VersionTable).Scan(&exists))
	if !exists {
		return -1
	}
	v, err := migrations.Current(ctx, conn)
	require.NoError(t, err)
	return v
}

// progressLine matches a progress line of migrate --fleet.
var progressLine = regexp.MustCompile(`(?m)^\[(\d+)/(\d+)\] (\S+): (.*)$`)

// progress maps each tenant to its progress line's text, requiring one line per tenant,
// numbered 1..N.
func progress(t *testing.T, out string, n int) map[string]string {
	t.Helper()
	got := map[string]string{}
	for i, m := range progressLine.FindAllStringSubmatch(out, -1) {
		require.Equal(t, fmt.Sprint(i+1), m[1], out)
		require.Equal(t, fmt.Sprint(n), m[2], out)
		require.NotContains(t, got, m[3], "one line per tenant: %s", out)
		got[m[3]] = m[4]
	}
	require.Len(t, got, n, out)
	return got
}

// TestMigrateFleetContinuesPastAFailingTenantAndResumes migrates three tenant databases, one
// unreachable: the other two are migrated, the failure is named, the exit is non-zero; a
// re-run skips the migrated ones, --from starts at a tenant, a dry run changes nothing.
func TestMigrateFleetContinuesPastAFailingTenantAndResumes(t *testing.T) {
	t.Parallel()
	acme, globex := testdb.EmptyURL(t), testdb.EmptyURL(t)
	b := setupFleet(t,
		fleet.Tenant{Name: "globex", DatabaseURL: globex},
		fleet.Tenant{Name: "acme", DatabaseURL: acme},
		fleet.Tenant{Name: "down", DatabaseURL: unreachableURL})
	latest := migrations.Latest()

	dry := b.run(t, "migrate", "--fleet", "--fleet-tenants", b.file, "--dry-run")
	require.Equal(t, cli.ExitError, dry.code, "the unreachable tenant fails a dry run too: %s", dry.err)
	lines := progress(t, dry.out, 3)
	require.Equal(t, fmt.Sprintf("would migrate 0 → %d", latest), lines["acme"])
	require.Equal(t, fmt.Sprintf("would migrate 0 → %d", latest), lines["globex"])
	require.Contains(t, lines["down"], "FAILED: cannot reach the database")
	require.Contains(t, dry.out, fmt.Sprintf("3 tenants: 2 to migrate, 0 already at version %d, 1 failed (down); nothing was changed", latest))
	require.EqualValues(t, -1, schemaVersion(t, acme), "a dry run creates nothing, not even the version table")

	r := b.run(t, "migrate", "--fleet", "--fleet-tenants", b.file)
	requireOneLineError(t, r, cli.ExitError, "1 of 3 tenants failed: down")
	lines = progress(t, r.out, 3)
	require.Equal(t, fmt.Sprintf("0 → %d", latest), lines["acme"])
	require.Equal(t, fmt.Sprintf("0 → %d", latest), lines["globex"])
	require.Contains(t, lines["down"], "FAILED: cannot reach the database postgres://sluice:xxxxx@127.0.0.1:1/tenant")
	require.NotContains(t, r.out+r.err, "secret", "passwords are masked")
	require.Contains(t, r.out, fmt.Sprintf("3 tenants: 2 migrated, 0 already at version %d, 1 failed (down)", latest))
	require.Equal(t, latest, schemaVersion(t, acme))
	require.Equal(t, latest, schemaVersion(t, globex))

	// A re-run, two at a time: the migrated tenants are skipped, the failing one fails again.
	r = b.run(t, "migrate", "up", "--fleet", "--fleet-tenants", b.file, "--parallel", "2")
	requireOneLineError(t, r, cli.ExitError, "1 of 3 tenants failed: down")
	lines = progress(t, r.out, 3)
	require.Equal(t, fmt.Sprintf("at version %d, nothing to do", latest), lines["acme"])
	require.Equal(t, fmt.Sprintf("at version %d, nothing to do", latest), lines["globex"])

	// --from starts at a tenant, in name order: down is before globex.
	out := b.ok(t, "migrate", "--fleet", "--fleet-tenants", b.file, "--from", "globex")
	require.Equal(t, map[string]string{"globex": fmt.Sprintf("at version %d, nothing to do", latest)}, progress(t, out, 1))
	require.Contains(t, out, "migrating 1 of 3 tenants (from globex)")
	require.Contains(t, out, fmt.Sprintf("1 tenants: 0 migrated, 1 already at version %d", latest))
}

// TestMigrateFleetBadInputIsOneLine: bad flags and registries are refused before any tenant is
// touched.
func TestMigrateFleetBadInputIsOneLine(t *testing.T) {
	t.Parallel()
	empty := testdb.EmptyURL(t)
	b := setupFleet(t, fleet.Tenant{Name: "acme", DatabaseURL: empty})
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`[{"name":"a","database_url":"postgres://x"}]`), 0o600))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--fleet"}, "no fleet: pass --fleet-registry URL or --fleet-tenants FILE"},
		{[]string{"migrate", "--fleet", "--fleet-tenants", b.file, "--from", "nobody"}, "--from nobody: no tenant of that name"},
		{[]string{"migrate", "--fleet", "--fleet-tenants", b.file, "--parallel", "0"}, "--parallel 0 is not between 1 and 32"},
		{[]string{"migrate", "--fleet-tenants", b.file}, "--fleet-tenants needs --fleet"},
		{[]string{"migrate", "up", "--from", "acme"}, "--from needs --fleet"},
		{[]string{"migrate", "--fleet", "--fleet-tenants", b.file, "--database-url", empty}, "--database-url names one database"},
		{[]string{"migrate", "--fleet", "--fleet-tenants", bad}, `unknown field "database_url"`},
		{[]string{"status", "--fleet", "--fleet-tenants", "-"}, "--fleet-tenants - is empty"}, // stdin is empty
		{[]string{"migrate", "--fleet", "--fleet-tenants", filepath.Join(t.TempDir(), "missing.json")}, "no such file"},
		{[]string{"status", "--fleet", "--fleet-tenants", b.file, "--queue", "http://localhost:4566/000000000000/q"}, "--queue is not read per tenant"},
		{[]string{"status", "--timeout", "5s"}, "--timeout needs --fleet"},
	} {
		requireOneLineError(t, b.run(t, c.args...), cli.ExitUsage, c.want)
	}
	require.EqualValues(t, -1, schemaVersion(t, empty), "nothing was migrated")
}

// TestStatusFleetShowsFailingTenantsFirstThenWorstLag reads four tenants: one unreachable, one
// without sluice's tables, one with an old backlog and a quiet one; the failing ones come
// first with their errors, the others don't stop, then the worst lag first.
func TestStatusFleetShowsFailingTenantsFirstThenWorstLag(t *testing.T) {
	t.Parallel()
	busy, quiet := setup(t), setup(t)
	busy.insertOutbox(t, outboxRow{aggID: "o-1", age: 2 * time.Hour})
	busy.insertOutbox(t, outboxRow{aggID: "o-2", age: time.Hour})
	busy.insertOutbox(t, outboxRow{aggID: "o-3", quarantined: true})
	quiet.insertOutbox(t, outboxRow{aggID: "o-1", age: time.Minute})
	b := setupFleet(t,
		fleet.Tenant{Name: "a-quiet", DatabaseURL: quiet.url},
		fleet.Tenant{Name: "b-busy", DatabaseURL: busy.url},
		fleet.Tenant{Name: "c-bare", DatabaseURL: testdb.EmptyURL(t)},
		fleet.Tenant{Name: "d-down", DatabaseURL: unreachableURL})

	r := b.run(t, "status", "--fleet", "--fleet-tenants", b.file, "--parallel", "2")
	requireOneLineError(t, r, cli.ExitError, "2 of 4 tenants failing: c-bare, d-down")
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	require.Len(t, lines, 6, r.out)
	require.Regexp(t, `^TENANT\s+PENDING\s+OLDEST\s+QUARANTINED`, lines[0])
	require.Regexp(t, "^c-bare\\s+FAILING: .*outbox_event.* does not exist .*run `sluice migrate --fleet --from c-bare`", lines[1])
	require.Regexp(t, `^d-down\s+FAILING: cannot reach the database`, lines[2])
	require.Regexp(t, `^b-busy\s+2\s+2h\d+m\s+1\s`, lines[3])
	require.Regexp(t, `^a-quiet\s+1\s+1m\d+s\s+0\s`, lines[4])
	require.Equal(t, "4 tenants, 2 failing", lines[5])

	r = b.run(t, "status", "--fleet", "--fleet-tenants", b.file, "--json")
	require.Equal(t, cli.ExitError, r.code, r.err)
	var doc struct {
		Tenants []struct {
			Tenant string `json:"tenant"`
			Error  string `json:"error"`
			Outbox *struct {
				Pending                 int64   `json:"pending"`
				OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
				Quarantined             int64   `json:"quarantined"`
			} `json:"outbox"`
		} `json:"tenants"`
		Failing int `json:"failing"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &doc), r.out)
	require.Equal(t, 2, doc.Failing)
	var order []string
	for _, tn := range doc.Tenants {
		order = append(order, tn.Tenant)
		require.Equal(t, tn.Error != "", tn.Outbox == nil, "a tenant has an error or a status: %+v", tn)
	}
	require.Equal(t, []string{"c-bare", "d-down", "b-busy", "a-quiet"}, order)
	require.EqualValues(t, 2, doc.Tenants[2].Outbox.Pending)
	require.EqualValues(t, 1, doc.Tenants[2].Outbox.Quarantined)
	require.Greater(t, doc.Tenants[2].Outbox.OldestPendingAgeSeconds, 7000.0)

	// Every tenant healthy: exit 0.
	ok := setupFleet(t, fleet.Tenant{Name: "a-quiet", DatabaseURL: quiet.url})
	require.Contains(t, ok.ok(t, "status", "--fleet", "--fleet-tenants", ok.file), "1 tenants, 0 failing")
}

// TestStatusFleetTimesOutASlowTenant: a tenant that holds its answer past --timeout is
// reported as failing, and the others are read.
func TestStatusFleetTimesOutASlowTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	slow, quiet := setup(t), setup(t)
	// An exclusive lock on outbox_event makes every read of it wait.
	tx, err := slow.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	_, err = tx.Exec(ctx, `LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	b := setupFleet(t, fleet.Tenant{Name: "quiet", DatabaseURL: quiet.url}, fleet.Tenant{Name: "slow", DatabaseURL: slow.url})
	r := b.run(t, "status", "--fleet", "--fleet-tenants", b.file, "--timeout", "5s")
	requireOneLineError(t, r, cli.ExitError, "1 of 2 tenants failing: slow")
	require.Regexp(t, `(?m)^slow\s+FAILING: no answer within 5s \(--timeout\)`, r.out)
	require.Regexp(t, `(?m)^quiet\s+0\s`, r.out)
}

// TestFleetRegistryAddListRemove: init creates the control table, add/list/remove round-trip,
// and the fleet commands read the registry.
func TestFleetRegistryAddListRemove(t *testing.T) {
	t.Parallel()
	control := testdb.EmptyURL(t)
	tenant := setup(t)
	b := &testBundle{env: map[string]string{}}

	r := b.run(t, "fleet", "add", "acme", "--url", tenant.url, "--fleet-registry", control)
	requireOneLineError(t, r, cli.ExitError, "sluice fleet init")
	requireOneLineError(t, b.run(t, "fleet", "list"), cli.ExitUsage, "no fleet")
	requireOneLineError(t, b.run(t, "fleet", "add", "acme", "--fleet-registry", control), cli.ExitUsage, "exactly one of --url and --secret-arn")
	requireOneLineError(t, b.run(t, "fleet", "init", "--database-url", control), cli.ExitUsage, "--database-url names one database")

	b.env["SLUICE_FLEET_REGISTRY_URL"] = control // the flag's fallback, as the Lambdas read it
	require.Contains(t, b.ok(t, "fleet", "init"), "sluice_fleet_tenant is ready")
	require.Contains(t, b.ok(t, "fleet", "init"), "is ready", "init is idempotent")
	require.Contains(t, b.ok(t, "fleet", "add", "acme", "--url", tenant.url, "--yes"), "added tenant acme")
	b.ok(t, "fleet", "add", "globex", "--secret-arn", "arn:aws:secretsmanager:eu-west-1:123456789012:secret:globex", "--server", "db-2", "--weight", "3", "--yes")
	requireOneLineError(t, b.run(t, "fleet", "add", "Bad Name", "--url", tenant.url), cli.ExitError, "tenant name")
	requireOneLineError(t, b.run(t, "fleet", "add", "heavy", "--url", tenant.url, "--weight", "101"), cli.ExitError, "weight 101")

	out := b.ok(t, "fleet", "list")
	require.Regexp(t, `(?m)^acme\s+-\s+1\s+postgres://`, out)
	require.Regexp(t, `(?m)^globex\s+db-2\s+3\s+secret arn:aws:secretsmanager:eu-west-1:123456789012:secret:globex$`, out)
	require.Contains(t, out, "2 tenants")
	var listed []fleet.Tenant
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "fleet", "list", "--json")), &listed))
	require.Equal(t, []string{"acme", "globex"}, []string{listed[0].Name, listed[1].Name})
	require.Equal(t, 3, listed[1].Weight)

	// status --fleet reads the registry; globex's secret is read through Secrets Manager, which
	// this test has none of: globex fails alone.
	r = b.runWith(t, context.Background(), &cli.Hooks{Secrets: secretsOf{}}, "status", "--fleet")
	requireOneLineError(t, r, cli.ExitError, "1 of 2 tenants failing: globex")
	require.Regexp(t, `(?m)^acme\s+0\s`, r.out)

	// A static list beside the table, as the relay serves both: a name in both is taken from
	// its first listing, the static one, with a note.
	static := setupFleet(t, fleet.Tenant{Name: "acme", DatabaseURL: unreachableURL}, fleet.Tenant{Name: "initech", DatabaseURL: tenant.url})
	r = b.run(t, "fleet", "list", "--fleet-tenants", static.file)
	require.Equal(t, 0, r.code, r.err)
	require.Equal(t, "note: tenant acme is listed twice; its first listing is used, as the relay does\n", r.err)
	require.Regexp(t, `(?m)^acme\s+-\s+1\s+postgres://sluice:xxxxx@127.0.0.1:1/`, r.out)
	require.Regexp(t, `(?m)^globex\s`, r.out)
	require.Regexp(t, `(?m)^initech\s`, r.out)
	require.Contains(t, r.out, "3 tenants")

	require.Contains(t, b.ok(t, "fleet", "remove", "globex", "--yes"), "removed tenant globex")
	requireOneLineError(t, b.run(t, "fleet", "remove", "globex", "--yes"), cli.ExitError, "no tenant globex in the fleet registry")
	out = b.ok(t, "fleet", "list")
	require.NotContains(t, out, "globex")
	require.Contains(t, out, "1 tenants")
	require.Contains(t, b.ok(t, "status", "--fleet"), "1 tenants, 0 failing")
}

// TestFleetTenantBySecretARN: a tenant given by secretArn is reached through its RDS secret
// as the relay reaches it (sslmode from DATABASE_SSLMODE), the list coming from
// SLUICE_FLEET_TENANTS as the relay gets it.
func TestFleetTenantBySecretARN(t *testing.T) {
	t.Parallel()
	empty := testdb.EmptyURL(t)
	const arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:acme"
	b := setupFleet(t, fleet.Tenant{Name: "acme", SecretARN: arn, Server: "db-1"})
	b.env["DATABASE_SSLMODE"] = "disable"
	b.env["SLUICE_FLEET_TENANTS"] = mustRead(t, b.file)
	hooks := &cli.Hooks{Secrets: secretsOf{arn: rdsSecretOf(t, empty)}}
	r := b.runWith(t, context.Background(), hooks, "migrate", "--fleet")
	require.Equal(t, 0, r.code, "stdout: %s\nstderr: %s", r.out, r.err)
	require.Equal(t, fmt.Sprintf("0 → %d", migrations.Latest()), progress(t, r.out, 1)["acme"])
	require.Equal(t, migrations.Latest(), schemaVersion(t, empty))
}

func mustRead(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	return string(data)
}

// secretsOf is a Secrets Manager of fixed secrets by ARN.
type secretsOf map[string]string

func (s secretsOf) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	v, ok := s[aws.ToString(in.SecretId)]
	if !ok {
		return nil, fmt.Errorf("ResourceNotFoundException: secret %s not found", aws.ToString(in.SecretId))
	}
	return &secretsmanager.GetSecretValueOutput{SecretString: aws.String(v), VersionId: aws.String("v1")}, nil
}

// rdsSecretOf is the RDS secret JSON of a database URL.
func rdsSecretOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	pw, _ := p.User.Password()
	data, err := json.Marshal(map[string]any{"host": p.Hostname(), "port": p.Port(), "username": p.User.Username(),
		"password": pw, "dbname": strings.TrimPrefix(p.Path, "/")})
	require.NoError(t, err)
	return string(data)
}

// TestMigrateFleetInterruptedStartsNoFurtherTenant: once the context ends, the tenant under
// way is migrated to the end and no other starts; the result names those not started.
func TestMigrateFleetInterruptedStartsNoFurtherTenant(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	urls := map[string]string{"a": testdb.EmptyURL(t), "b": testdb.EmptyURL(t), "c": testdb.EmptyURL(t)}
	tenants := []fleet.Tenant{{Name: "c", DatabaseURL: urls["c"]}, {Name: "a", DatabaseURL: urls["a"]}, {Name: "b", DatabaseURL: urls["b"]}}
	res, err := cli.MigrateFleet(ctx, tenants, cli.FleetMigrateOptions{
		Open: func(ctx context.Context, tn fleet.Tenant) (*pgxpool.Pool, error) {
			cancel() // Ctrl-C while the first tenant is under way
			return pgxpool.New(ctx, tn.DatabaseURL)
		},
	})
	require.ErrorIs(t, err, cli.ErrInterrupted)
	require.Len(t, res.Tenants, 1)
	require.Equal(t, cli.TenantMigration{Tenant: "a", From: 0, To: migrations.Latest(), Migrated: true}, res.Tenants[0])
	require.Equal(t, []string{"b", "c"}, res.NotStarted)
	require.Equal(t, migrations.Latest(), schemaVersion(t, urls["a"]))
	require.EqualValues(t, -1, schemaVersion(t, urls["b"]))
}
