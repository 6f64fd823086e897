package lambdaenv

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/pkg/fleet"
)

// A tenant of a server listed in SLUICE_FLEET_IAM_SERVERS logs in with an IAM authentication
// token per connection, made for the connection's endpoint, user and the function's region,
// and used as its password. There is no RDS here: the test's PostgreSQL (TLS and
// scram-sha-256, as RDS requires) is told, as each token is signed, that this token is the
// role's password, so a connection succeeds only if the token it was given reached the server
// as its password. The same URL on a server not listed logs in with its own (empty) password
// and is refused.
func TestFleetTenantsOfAnIAMServerLogInWithATokenPerConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl, err := pgcluster.Start(ctx, pgcluster.Options{Password: "admin-pw-42"})
	require.NoError(t, err)
	t.Cleanup(cl.Stop)
	admin, err := pgx.Connect(ctx, cl.URL)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	for _, stmt := range []string{`CREATE ROLE iam_relay LOGIN`, `CREATE DATABASE tenant_acme`} {
		_, err := admin.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	server, err := url.Parse(cl.URL)
	require.NoError(t, err)
	endpoint := server.Host // 127.0.0.1:port
	tenantURL := "postgres://iam_relay@" + endpoint + "/postgres?sslmode=require"

	signer := NewIAMTokenSigner(aws.Config{Region: "eu-central-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDSLUICETEST", "not-a-secret", "")})
	type signed struct{ endpoint, user, token string }
	var (
		mu    sync.Mutex
		calls []signed
	)
	sign := func(ctx context.Context, ep, user string) (string, error) {
		token, err := signer(ctx, ep, user)
		if err != nil {
			return "", err
		}
		mu.Lock()
		defer mu.Unlock()
		// What RDS does for a valid token, the test server does for this one.
		if _, err := admin.Exec(ctx, `SELECT set_config('sluice.token', $1, false)`, token); err != nil {
			return "", err
		}
		if _, err := admin.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER ROLE iam_relay PASSWORD %L', current_setting('sluice.token')); END $$`); err != nil {
			return "", err
		}
		calls = append(calls, signed{ep, user, token})
		return token, nil
	}
	getenv := func(v string) string {
		if v == FleetIAMServers {
			return `["db1"]`
		}
		return ""
	}
	tenant := fleet.Tenant{Name: "acme", DatabaseURL: tenantURL, Server: "db1", Database: "tenant_acme"}
	cfg, err := fleetConnector(getenv, nil, sign)(ctx, tenant)
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c1, err := pool.Acquire(ctx)
	require.NoError(t, err, "the first connection logs in with its token")
	c2, err := pool.Acquire(ctx)
	require.NoError(t, err, "the second connection logs in with a token of its own")
	var user, db string
	require.NoError(t, c2.QueryRow(ctx, `SELECT current_user, current_database()`).Scan(&user, &db))
	require.Equal(t, "iam_relay", user)
	require.Equal(t, "tenant_acme", db, "the tenant's Database")
	c1.Release()
	c2.Release()

	mu.Lock()
	got := append([]signed(nil), calls...)
	mu.Unlock()
	require.Len(t, got, 2, "a token per connection")
	for _, c := range got {
		require.Equal(t, endpoint, c.endpoint)
		require.Equal(t, "iam_relay", c.user)
		tok, err := url.Parse("https://" + c.token)
		require.NoError(t, err)
		require.Equal(t, endpoint, tok.Host, "the token is for the connection's host and port")
		q := tok.Query()
		require.Equal(t, "connect", q.Get("Action"))
		require.Equal(t, "iam_relay", q.Get("DBUser"))
		require.True(t, strings.HasPrefix(q.Get("X-Amz-Credential"), "AKIDSLUICETEST/"), q.Get("X-Amz-Credential"))
		require.True(t, strings.HasSuffix(q.Get("X-Amz-Credential"), "/eu-central-1/rds-db/aws4_request"), q.Get("X-Amz-Credential"))
		require.NotEmpty(t, q.Get("X-Amz-Signature"))
	}

	// Not an IAM server: the URL's own password (none) is used, and refused.
	other := func(v string) string {
		if v == FleetIAMServers {
			return `["db2"]`
		}
		return ""
	}
	cfg, err = fleetConnector(other, nil, sign)(ctx, tenant)
	require.NoError(t, err)
	plain, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(plain.Close)
	err = plain.Ping(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), "password")
	mu.Lock()
	require.Len(t, calls, 2, "no token for a server not listed")
	mu.Unlock()
}
