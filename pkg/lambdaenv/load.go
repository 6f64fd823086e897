package lambdaenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Getenv reads one variable; os.Getenv in production, a map in tests.
type Getenv func(string) string

// SecretGetter is the one Secrets Manager call needed to read database credentials.
type SecretGetter interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

var _ SecretGetter = (*secretsmanager.Client)(nil)

// DatabaseURLFrom returns the PostgreSQL URL: DATABASE_URL when set (used as it is: local runs
// and tests may connect without TLS), otherwise one built from the Secrets Manager secret named by
// DATABASE_SECRET_ARN (read with secrets, once) with sslmode DATABASE_SSLMODE (default
// DefaultSSLMode, "verify-full") and sslrootcert DATABASE_SSLROOTCERT; DATABASE_HOST and
// DATABASE_PORT replace the secret's host and port (an RDS Proxy endpoint).
func DatabaseURLFrom(ctx context.Context, getenv Getenv, secrets SecretGetter) (string, error) {
	if u := getenv(DatabaseURL); u != "" {
		return u, nil
	}
	arn := getenv(DatabaseSecretARN)
	if arn == "" {
		return "", fmt.Errorf("no database configured: set %s, or %s to an RDS Secrets Manager secret", DatabaseURL, DatabaseSecretARN)
	}
	if secrets == nil {
		return "", errors.New("a Secrets Manager client is needed to read " + DatabaseSecretARN)
	}
	s, err := readSecret(ctx, secrets, arn, "")
	if err != nil {
		return "", err
	}
	return s.url(getenv), nil
}

// PoolConfig parses url into a pool configuration capped at DATABASE_MAX_CONNS (default
// DefaultMaxConns) connections, so that concurrent Lambda instances do not exhaust the database,
// with DATABASE_QUERY_EXEC_MODE as pgx's default query execution mode when set.
func PoolConfig(url string, getenv Getenv) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = DefaultMaxConns
	if v := getenv(DatabaseMaxConns); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return nil, fmt.Errorf("%s must be a positive integer up to 10000, got %q", DatabaseMaxConns, v)
		}
		cfg.MaxConns = int32(n)
	}
	if v := getenv(DatabaseQueryExecMode); v != "" {
		mode, ok := queryExecModes[v]
		if !ok {
			return nil, fmt.Errorf("%s must be one of cache_statement, cache_describe, describe_exec, exec or simple_protocol, got %q", DatabaseQueryExecMode, v)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
	}
	cfg.MaxConnIdleTime = 5 * time.Minute
	return cfg, nil
}

// Topics reads SLUICE_TOPIC_ARNS (a JSON object of logical topic → destination, see TopicARNs)
// and SLUICE_DEFAULT_TOPIC_ARN.
func Topics(getenv Getenv) (map[string]string, string, error) {
	topics := map[string]string{}
	if raw := getenv(TopicARNs); raw != "" {
		if err := json.Unmarshal([]byte(raw), &topics); err != nil {
			return nil, "", fmt.Errorf("%s must be a JSON object of topic name to SNS topic ARN: %w", TopicARNs, err)
		}
	}
	def := getenv(DefaultTopicARN)
	if len(topics) == 0 && def == "" {
		return nil, "", fmt.Errorf("no SNS topic configured: set %s (JSON object) or %s", TopicARNs, DefaultTopicARN)
	}
	return topics, def, nil
}

// Duration reads a Go duration variable, or def when unset.
func Duration(getenv Getenv, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s must be a non-negative Go duration such as 5s, got %q", name, v)
	}
	return d, nil
}

// ResolveDatabaseURL is DatabaseURLFrom with a Secrets Manager client built from the default
// AWS configuration, only when DATABASE_URL is unset and the secret must be read.
func ResolveDatabaseURL(ctx context.Context, getenv Getenv) (string, error) {
	var secrets SecretGetter
	if getenv(DatabaseURL) == "" {
		c, err := secretsClient(ctx)
		if err != nil {
			return "", err
		}
		secrets = c
	}
	return DatabaseURLFrom(ctx, getenv, secrets)
}

// OpenPool opens a pool capped at DATABASE_MAX_CONNS connections: what every sluice Lambda does
// once per cold start. With DATABASE_URL it connects to that URL. With DATABASE_SECRET_ARN it
// reads the secret once and then again whenever a new connection is needed after an attempt that
// did not succeed (at most every DATABASE_SECRET_REFRESH), trying the secret's AWSPENDING version
// when AWSCURRENT still holds the credentials that failed: a warm Lambda keeps connecting through
// a rotation of the secret.
func OpenPool(ctx context.Context, getenv Getenv) (*pgxpool.Pool, error) {
	var secrets SecretGetter
	if getenv(DatabaseURL) == "" {
		c, err := secretsClient(ctx)
		if err != nil {
			return nil, err
		}
		secrets = c
	}
	return openPool(ctx, getenv, secrets)
}

func secretsClient(ctx context.Context) (*secretsmanager.Client, error) {
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("load AWS config: %w", err)
	}
	return secretsmanager.NewFromConfig(awsCfg), nil
}

// Logger returns the functions' JSON logger on stderr at SLUICE_LOG_LEVEL (default info), with a
// "function" attribute. An unknown level is reported once and info is used.
func Logger(getenv Getenv, function string) *slog.Logger {
	var level slog.Level
	bad := level.UnmarshalText([]byte(getenv(LogLevel))) != nil && getenv(LogLevel) != ""
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("function", function)
	if bad {
		log.Warn("unknown log level; using info", "variable", LogLevel, "value", getenv(LogLevel))
	}
	return log
}
