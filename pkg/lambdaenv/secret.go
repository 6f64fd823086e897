package lambdaenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultSSLMode is the sslmode of connections built from DATABASE_SECRET_ARN when
// DATABASE_SSLMODE is unset: TLS, with the server certificate checked against
// DATABASE_SSLROOTCERT and the host name.
const DefaultSSLMode = "verify-full"

// DefaultMaxConns is DATABASE_MAX_CONNS's default: the pool size of one Lambda instance.
const DefaultMaxConns = 4

// DefaultSecretRefresh is DATABASE_SECRET_REFRESH's default: the shortest time between two
// re-reads of the database secret after failed connection attempts.
const DefaultSecretRefresh = 5 * time.Second

var queryExecModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// rdsSecret is the JSON shape of an RDS-generated Secrets Manager secret.
type rdsSecret struct {
	Host     string          `json:"host"`
	Port     json.RawMessage `json:"port"`
	Username string          `json:"username"`
	Password string          `json:"password"`
	DBName   string          `json:"dbname"`

	versionID string
}

// readSecret reads one version stage of the secret ("" is AWSCURRENT) and checks its shape.
func readSecret(ctx context.Context, secrets SecretGetter, arn, stage string) (rdsSecret, error) {
	in := &secretsmanager.GetSecretValueInput{SecretId: aws.String(arn)}
	if stage != "" {
		in.VersionStage = aws.String(stage)
	}
	out, err := secrets.GetSecretValue(ctx, in)
	if err != nil {
		return rdsSecret{}, fmt.Errorf("read database secret %s: %w", arn, err)
	}
	var s rdsSecret
	if err := json.Unmarshal([]byte(aws.ToString(out.SecretString)), &s); err != nil {
		return rdsSecret{}, fmt.Errorf("database secret %s is not RDS secret JSON: %w", arn, err)
	}
	if s.Host == "" || s.Username == "" {
		return rdsSecret{}, fmt.Errorf("database secret %s lacks host or username", arn)
	}
	s.versionID = aws.ToString(out.VersionId)
	return s, nil
}

func (s rdsSecret) port() string {
	var n int
	var str string
	switch {
	case len(s.Port) == 0:
	case json.Unmarshal(s.Port, &n) == nil:
		return strconv.Itoa(n)
	case json.Unmarshal(s.Port, &str) == nil && str != "":
		return str
	}
	return "5432"
}

// url builds the connection URL: the secret's credentials and database, the host and port from
// DATABASE_HOST/DATABASE_PORT or the secret, sslmode and sslrootcert from the environment.
func (s rdsSecret) url(getenv Getenv) string {
	host, port := s.Host, s.port()
	if h := getenv(DatabaseHost); h != "" {
		host = h
	}
	if p := getenv(DatabasePort); p != "" {
		port = p
	}
	db := s.DBName
	if db == "" {
		db = "postgres"
	}
	q := url.Values{"sslmode": {DefaultSSLMode}}
	if m := getenv(DatabaseSSLMode); m != "" {
		q.Set("sslmode", m)
	}
	if ca := getenv(DatabaseSSLRootCert); ca != "" {
		q.Set("sslrootcert", ca)
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(s.Username, s.Password), Host: net.JoinHostPort(host, port),
		Path: "/" + db, RawQuery: q.Encode()}
	return u.String()
}

// openPool opens the pool of OpenPool with the given Secrets Manager client (nil with DATABASE_URL).
func openPool(ctx context.Context, getenv Getenv, secrets SecretGetter) (*pgxpool.Pool, error) {
	if getenv(DatabaseURL) == "" && (getenv(DatabaseSecretARN) == "" || secrets == nil) {
		_, err := DatabaseURLFrom(ctx, getenv, secrets)
		return nil, err
	}
	cfg, err := secretPoolConfig(ctx, getenv, secrets, getenv(DatabaseURL), getenv(DatabaseSecretARN))
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create database pool: %w", err)
	}
	return pool, nil
}

// secretPoolConfig is the pool configuration (PoolConfig) of url, or, when url is "", of the
// database the RDS secret arn names, whose credentials every new connection takes from the
// secret and re-reads after a failed connection attempt (secretCredentials): a warm pool follows
// a rotation. Every pool opened from a secret (the function's own, the fleet's control
// database) is configured here.
func secretPoolConfig(ctx context.Context, getenv Getenv, secrets SecretGetter, url, arn string) (*pgxpool.Config, error) {
	var creds *secretCredentials
	if url == "" {
		if secrets == nil {
			return nil, fmt.Errorf("a Secrets Manager client is needed to read the database secret %s", arn)
		}
		refresh, err := Duration(getenv, DatabaseSecretRefresh, DefaultSecretRefresh)
		if err != nil {
			return nil, err
		}
		s, err := readSecret(ctx, secrets, arn, "")
		if err != nil {
			return nil, err
		}
		creds = &secretCredentials{secrets: secrets, arn: arn, minInterval: refresh, current: s, readAt: time.Now()}
		url = s.url(getenv)
	}
	cfg, err := PoolConfig(url, getenv)
	if err != nil {
		return nil, err
	}
	if creds != nil {
		cfg.BeforeConnect = creds.beforeConnect
		cfg.AfterConnect = creds.afterConnect
	}
	return cfg, nil
}

// secretCredentials hands the database secret's user and password to every new connection of a
// pool and re-reads the secret when a connection attempt did not succeed, so that a warm Lambda
// follows a rotation. pgx reports a failed attempt to nobody but the caller of Acquire, so an
// attempt counts as failed until AfterConnect confirms it; the next attempt after an unconfirmed
// one re-reads the secret (at most every minInterval). A re-read that finds AWSCURRENT unchanged
// tries AWSPENDING: during a single-user rotation the database already has the pending password
// for a few seconds before the secret's AWSCURRENT label moves to it.
type secretCredentials struct {
	secrets     SecretGetter
	arn         string
	minInterval time.Duration

	mu          sync.Mutex
	current     rdsSecret // the credentials new connections use
	readAt      time.Time
	unconfirmed int // attempts begun with current and not confirmed by afterConnect
}

func (c *secretCredentials) beforeConnect(ctx context.Context, cfg *pgx.ConnConfig) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unconfirmed > 0 && time.Since(c.readAt) >= c.minInterval {
		if err := c.refresh(ctx); err != nil {
			return err
		}
	}
	c.unconfirmed++
	cfg.User, cfg.Password = c.current.Username, c.current.Password
	return nil
}

func (c *secretCredentials) afterConnect(context.Context, *pgx.Conn) error {
	c.mu.Lock()
	c.unconfirmed = 0
	c.mu.Unlock()
	return nil
}

// refresh re-reads the secret; c.mu is held.
func (c *secretCredentials) refresh(ctx context.Context) error {
	s, err := readSecret(ctx, c.secrets, c.arn, "")
	if err != nil {
		return fmt.Errorf("re-read the database secret after a failed connection attempt: %w", err)
	}
	if s.Username == c.current.Username && s.Password == c.current.Password {
		// Without a rotation in progress there is no AWSPENDING version (an error we ignore: the
		// next attempt uses AWSCURRENT again, and its connection error is what the caller sees).
		if pending, err := readSecret(ctx, c.secrets, c.arn, "AWSPENDING"); err == nil {
			s = pending
		}
	}
	c.current, c.readAt, c.unconfirmed = s, time.Now(), 0
	return nil
}
