// Package testdb gives each test its own migrated PostgreSQL database, so tests run in parallel
// against a real server. It uses TEST_DATABASE_URL when set (a superuser connection to any
// database of the server) and otherwise a throwaway cluster started by [Main].
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/migrations"
)

// EnvURL names the variable holding an existing server's URL.
const EnvURL = "TEST_DATABASE_URL"

var (
	mu       sync.Mutex
	adminURL string
	cluster  *pgcluster.Cluster
	// logicalURL and logicalCluster: the second throwaway cluster, with wal_level=logical,
	// started on the first LogicalURL.
	logicalURL     string
	logicalCluster *pgcluster.Cluster
	// templates is the migrated template's name per server URL, once built.
	templates = map[string]string{}
	// exampleDrops drop the databases of runnable examples when Main's tests end.
	exampleDrops []func()
)

// exampleTB lets the database helpers serve a runnable example, which has no *testing.T: a
// failure panics (the example fails with it), and cleanups run when Main's tests end.
type exampleTB struct {
	testing.TB // nil: any method not overridden here panics
	name       string
}

func (e exampleTB) Helper()      {}
func (e exampleTB) Name() string { return e.name }
func (e exampleTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("testdb: example %s: "+format, append([]any{e.name}, args...)...))
}
func (e exampleTB) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testdb: example %s: "+format+"\n", append([]any{e.name}, args...)...)
}
func (e exampleTB) Cleanup(f func()) {
	mu.Lock()
	defer mu.Unlock()
	exampleDrops = append(exampleDrops, f)
}

// ForExample creates a fresh database for a runnable example (Example functions have no
// *testing.T): migrated when migrated is true, dropped when Main's tests end. It panics on
// failure, which fails the example.
func ForExample(name string, migrated bool) string {
	tb := exampleTB{name: name}
	return create(tb, ServerURL(tb), migrated)
}

// Main runs the package's tests and then stops what they started on demand: the throwaway
// cluster (when TEST_DATABASE_URL is unset) and the local SNS/SQS emulator. Use it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	mu.Lock()
	for _, drop := range exampleDrops {
		drop()
	}
	exampleDrops = nil
	if cluster != nil {
		cluster.Stop()
	}
	if logicalCluster != nil {
		logicalCluster.Stop()
	}
	mu.Unlock()
	localaws.StopShared()
	os.Exit(code)
}

// ServerURL returns a superuser URL of the test server, starting the throwaway cluster on first use.
func ServerURL(t testing.TB) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if adminURL != "" {
		return adminURL
	}
	if u := os.Getenv(EnvURL); u != "" {
		adminURL = u
		return adminURL
	}
	c, err := pgcluster.Start(context.Background(), pgcluster.Options{})
	if err != nil {
		t.Fatalf("start throwaway PostgreSQL (set %s to use an existing server): %v", EnvURL, err)
	}
	cluster, adminURL = c, c.URL
	return adminURL
}

// URL creates a fresh, migrated database for this test and returns its URL.
// The database is dropped when the test ends.
func URL(t testing.TB) string {
	t.Helper()
	return create(t, ServerURL(t), true)
}

// LogicalSlots is how many replication slots and walsenders the server of LogicalURL allows.
const LogicalSlots = 64

// LogicalURL creates a fresh, migrated database for this test on a server with
// wal_level=logical (logical decoding: the relay's WAL wake-up) and returns its URL; the
// database is dropped when the test ends. The server is a second throwaway cluster, started on
// first use with LogicalSlots replication slots and walsenders, whatever TEST_DATABASE_URL names
// (a shared server is rarely logical, and its slots are not the tests' to spend).
func LogicalURL(t testing.TB) string {
	t.Helper()
	return create(t, logicalServerURL(t), true)
}

// logicalServerURL returns a superuser URL of the logical cluster, starting it on first use.
func logicalServerURL(t testing.TB) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if logicalURL != "" {
		return logicalURL
	}
	slots := strconv.Itoa(LogicalSlots)
	c, err := pgcluster.Start(context.Background(), pgcluster.Options{Settings: map[string]string{
		"wal_level": "logical", "max_replication_slots": slots, "max_wal_senders": slots}})
	if err != nil {
		t.Fatalf("start a throwaway PostgreSQL with wal_level=logical: %v", err)
	}
	logicalCluster, logicalURL = c, c.URL
	return logicalURL
}

// EmptyURL creates a fresh database without sluice's tables (for migration tests).
func EmptyURL(t testing.TB) string {
	t.Helper()
	return create(t, ServerURL(t), false)
}

// Pool returns a pool on a fresh, migrated database, closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), URL(t))
	if err != nil {
		t.Fatalf("connect test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

// create creates a fresh database on server, migrated or empty, dropped when t ends.
func create(t testing.TB, server string, migrated bool) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatalf("connect test server: %v", err)
	}
	defer admin.Close(ctx)

	from := "template0"
	if migrated {
		if from, err = migratedTemplate(ctx, admin); err != nil {
			t.Fatalf("prepare migrated template: %v", err)
		}
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	prefix := unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(prefix) > 40 {
		prefix = prefix[:40]
	}
	name := "t_" + prefix + "_" + hex.EncodeToString(suffix)

	// Serialise CREATE DATABASE across processes: copying a template needs it to be idle.
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(hashtext('sluice-testdb'))"); err != nil {
		t.Fatalf("lock: %v", err)
	}
	_, err = admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{from}.Sanitize()))
	_, _ = admin.Exec(ctx, "SELECT pg_advisory_unlock(hashtext('sluice-testdb'))")
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Logf("drop test database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	return withDatabase(server, name)
}

// migratedTemplate returns a template database at the embedded migrations' latest version,
// building it once per migration set on this server.
func migratedTemplate(ctx context.Context, admin *pgx.Conn) (string, error) {
	server := admin.Config().ConnString()
	mu.Lock()
	known := templates[server]
	mu.Unlock()
	if known != "" {
		return known, nil
	}
	ms, err := migrations.List()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, m := range ms {
		fmt.Fprintf(h, "%d\x00%s\x00%s\x00%s\x00", m.Version, m.Name, m.Up, m.Down)
	}
	name := "sluice_tmpl_" + hex.EncodeToString(h.Sum(nil))[:16]

	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(hashtext('sluice-testdb'))"); err != nil {
		return "", err
	}
	defer admin.Exec(ctx, "SELECT pg_advisory_unlock(hashtext('sluice-testdb'))")
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		building := name + "_building"
		ident := pgx.Identifier{building}.Sanitize()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			return "", err
		}
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident+" TEMPLATE template0"); err != nil {
			return "", err
		}
		conn, err := pgx.Connect(ctx, withDatabase(admin.Config().ConnString(), building))
		if err != nil {
			return "", err
		}
		err = migrations.Up(ctx, conn)
		conn.Close(ctx)
		if err != nil {
			return "", err
		}
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", ident, pgx.Identifier{name}.Sanitize())); err != nil {
			return "", err
		}
	}
	mu.Lock()
	templates[server] = name
	mu.Unlock()
	return name, nil
}

// withDatabase replaces the database name in a PostgreSQL URL (URL or key=value form).
func withDatabase(serverURL, db string) string {
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return serverURL
	}
	u := url.URL{Scheme: "postgres", Host: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), Path: "/" + db}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	} else {
		u.User = url.User(cfg.User)
	}
	if cfg.TLSConfig == nil {
		u.RawQuery = "sslmode=disable"
	}
	return u.String()
}
