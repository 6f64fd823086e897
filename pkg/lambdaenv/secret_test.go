package lambdaenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// rotatingSecret serves the Secrets Manager response shape for a secret whose versions change,
// as a rotation changes them; it counts the reads.
type rotatingSecret struct {
	mu     sync.Mutex
	stages map[string]string // version stage → secret JSON
	reads  int
}

func (s *rotatingSecret) set(stage, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if value == "" {
		delete(s.stages, stage)
		return
	}
	s.stages[stage] = value
}

func (s *rotatingSecret) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	stage := aws.ToString(in.VersionStage)
	if stage == "" {
		stage = "AWSCURRENT"
	}
	v, ok := s.stages[stage]
	if !ok {
		return nil, fmt.Errorf("ResourceNotFoundException: no version with stage %s", stage)
	}
	return &secretsmanager.GetSecretValueOutput{SecretString: aws.String(v), VersionId: aws.String(stage)}, nil
}

// secretJSON renders the RDS secret of user on the test server behind serverURL.
func secretJSON(t *testing.T, dbURL, user string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	b, err := json.Marshal(map[string]any{"host": u.Hostname(), "port": u.Port(), "username": user, "password": "unused-with-trust-auth",
		"dbname": strings.TrimPrefix(u.Path, "/"), "engine": "postgres"})
	require.NoError(t, err)
	return string(b)
}

// A warm pool keeps connecting after the secret changed under it: the attempt with the old
// credentials fails, and the next one re-reads the secret. The test server trusts local
// connections, so the rotation is modelled by switching the secret to another role and taking
// LOGIN from the old one (the failure PostgreSQL reports is then 28000 rather than 28P01; the
// pool treats every failed attempt alike).
func TestPoolReReadsTheSecretAfterAFailedConnectionAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.URL(t)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	oldRole, newRole := "sluice_rot_old_"+suffix, "sluice_rot_new_"+suffix
	for _, r := range []string{oldRole, newRole} {
		_, err := admin.Exec(ctx, "CREATE ROLE "+r+" LOGIN")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(context.WithoutCancel(ctx), "DROP ROLE IF EXISTS "+r) })
	}

	secret := &rotatingSecret{stages: map[string]string{"AWSCURRENT": secretJSON(t, dbURL, oldRole)}}
	getenv := env(map[string]string{DatabaseSecretARN: "arn:secret", DatabaseSSLMode: "disable", DatabaseSecretRefresh: "0s"})
	pool, err := openPool(ctx, getenv, secret)
	require.NoError(t, err)
	defer pool.Close()
	whoami := func() (string, error) {
		var u string
		return u, pool.QueryRow(ctx, "SELECT current_user").Scan(&u)
	}
	u, err := whoami()
	require.NoError(t, err)
	require.Equal(t, oldRole, u)

	// The rotation: the database stops accepting the old credentials, the secret holds new ones.
	_, err = admin.Exec(ctx, "ALTER ROLE "+oldRole+" NOLOGIN")
	require.NoError(t, err)
	secret.set("AWSCURRENT", secretJSON(t, dbURL, newRole))
	pool.Reset() // the warm instance's connections end (idle timeout, server restart, ...)

	_, err = whoami()
	require.Error(t, err, "the cached credentials no longer work")
	require.Contains(t, err.Error(), oldRole)
	u, err = whoami()
	require.NoError(t, err, "the next attempt re-read the secret")
	require.Equal(t, newRole, u)

	// During a single-user rotation the database has the pending credentials before AWSCURRENT
	// moves to them: an unchanged AWSCURRENT sends the pool to AWSPENDING.
	_, err = admin.Exec(ctx, "ALTER ROLE "+newRole+" NOLOGIN")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER ROLE "+oldRole+" LOGIN")
	require.NoError(t, err)
	secret.set("AWSPENDING", secretJSON(t, dbURL, oldRole))
	pool.Reset()
	_, err = whoami()
	require.Error(t, err)
	u, err = whoami()
	require.NoError(t, err, "the pending version is tried when the current one keeps failing")
	require.Equal(t, oldRole, u)

	// Confirmed connections do not re-read the secret.
	secret.mu.Lock()
	reads := secret.reads
	secret.mu.Unlock()
	pool.Reset()
	for range 3 {
		_, err = whoami()
		require.NoError(t, err)
	}
	secret.mu.Lock()
	defer secret.mu.Unlock()
	require.Equal(t, reads, secret.reads, "no re-read while connections succeed")
}

// Behind RDS Proxy the consumer runs pgx in exec mode: no named (session-level) prepared
// statements, which would pin every client connection to its own database connection.
func TestQueryExecModeExecLeavesNoPreparedStatementsInTheSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.URL(t)
	count := func(mode string) int {
		vars := map[string]string{}
		if mode != "" {
			vars[DatabaseQueryExecMode] = mode
		}
		cfg, err := PoolConfig(dbURL, env(vars))
		require.NoError(t, err)
		cfg.MaxConns = 1
		pool, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
		require.NoError(t, err)
		defer pool.Close(ctx)
		var one int
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one))
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&n))
		return n
	}
	require.Positive(t, count(""), "pgx's default mode prepares named statements")
	require.Zero(t, count("exec"))
	require.Zero(t, count("simple_protocol"))

	_, err := PoolConfig(dbURL, env(map[string]string{DatabaseQueryExecMode: "fast"}))
	require.ErrorContains(t, err, DatabaseQueryExecMode)
}

// testCA is a certificate authority made for one test, and the PEM file holding it.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), name+".pem")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return testCA{cert: cert, key: key, file: file}
}

// serverCert issues a server certificate for the given IP addresses.
func (ca testCA) serverCert(t *testing.T, ips ...net.IP) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "db"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: ips, DNSNames: []string{"db.internal"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// tlsServer answers PostgreSQL's SSLRequest with 'S' and completes a TLS handshake with cert
// (Go's TLS stack, as PostgreSQL's would); it reports each handshake's outcome and then hangs up,
// so no connection gets past TLS.
func tlsServer(t *testing.T, cert tls.Certificate) (addr string, handshakes <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	out := make(chan error, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				req := make([]byte, 8)
				if _, err := io.ReadFull(c, req); err != nil {
					out <- err
					return
				}
				if _, err := c.Write([]byte{'S'}); err != nil {
					out <- err
					return
				}
				out <- tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}}).Handshake()
			}()
		}
	}()
	return ln.Addr().String(), out
}

// Connections built from the secret verify the server: its certificate must chain to the
// configured CA bundle and name the host it was reached at.
func TestSecretConnectionsVerifyTheServerCertificate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rds, other := newTestCA(t, "rds-test-ca"), newTestCA(t, "other-ca")
	connect := func(cert tls.Certificate, rootCert string) (clientErr, serverErr error) {
		addr, handshakes := tlsServer(t, cert)
		host, port, _ := net.SplitHostPort(addr)
		secret := fixedSecret(fmt.Sprintf(`{"host":%q,"port":%s,"username":"sluice_relay","password":"pw","dbname":"sluice"}`, host, port))
		u, err := DatabaseURLFrom(ctx, env(map[string]string{DatabaseSecretARN: "arn:secret", DatabaseSSLRootCert: rootCert}), secret)
		require.NoError(t, err)
		cfg, err := PoolConfig(u, env(nil))
		require.NoError(t, err)
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
		conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
		if err == nil {
			conn.Close(ctx)
		}
		select {
		case serverErr = <-handshakes:
		case <-time.After(10 * time.Second):
			t.Fatal("the client never reached the TLS handshake")
		}
		return err, serverErr
	}

	clientErr, serverErr := connect(rds.serverCert(t, net.ParseIP("127.0.0.1")), rds.file)
	require.NoError(t, serverErr, "the client accepted the certificate signed by the bundle's CA for its host")
	require.Error(t, clientErr, "the test server hangs up after TLS")
	require.NotContains(t, clientErr.Error(), "x509")

	clientErr, serverErr = connect(other.serverCert(t, net.ParseIP("127.0.0.1")), rds.file)
	require.Error(t, serverErr, "the client refused the handshake")
	require.ErrorContains(t, clientErr, "x509", "a certificate from a CA outside the bundle")

	clientErr, serverErr = connect(rds.serverCert(t, net.ParseIP("10.9.9.9")), rds.file)
	require.Error(t, serverErr)
	require.ErrorContains(t, clientErr, "127.0.0.1", "a certificate for another host (verify-full checks the name)")
}
