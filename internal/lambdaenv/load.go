package lambdaenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
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

// rdsSecret is the JSON shape of an RDS-generated Secrets Manager secret.
type rdsSecret struct {
	Host     string          `json:"host"`
	Port     json.RawMessage `json:"port"`
	Username string          `json:"username"`
	Password string          `json:"password"`
	DBName   string          `json:"dbname"`
}

// DatabaseURLFrom returns the PostgreSQL URL: DATABASE_URL when set, otherwise one built from the
// Secrets Manager secret named by DATABASE_SECRET_ARN (read with secrets, once) with
// sslmode DATABASE_SSLMODE (default "require").
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
	out, err := secrets.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(arn)})
	if err != nil {
		return "", fmt.Errorf("read database secret %s: %w", arn, err)
	}
	var s rdsSecret
	if err := json.Unmarshal([]byte(aws.ToString(out.SecretString)), &s); err != nil {
		return "", fmt.Errorf("database secret %s is not RDS secret JSON: %w", arn, err)
	}
	port := "5432"
	if len(s.Port) > 0 {
		var n int
		var str string
		switch {
		case json.Unmarshal(s.Port, &n) == nil:
			port = strconv.Itoa(n)
		case json.Unmarshal(s.Port, &str) == nil && str != "":
			port = str
		}
	}
	if s.Host == "" || s.Username == "" {
		return "", fmt.Errorf("database secret %s lacks host or username", arn)
	}
	sslmode := getenv(DatabaseSSLMode)
	if sslmode == "" {
		sslmode = "require"
	}
	db := s.DBName
	if db == "" {
		db = "postgres"
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(s.Username, s.Password), Host: net.JoinHostPort(s.Host, port),
		Path: "/" + db, RawQuery: "sslmode=" + url.QueryEscape(sslmode)}
	return u.String(), nil
}

// PoolConfig parses url into a pool configuration capped at DATABASE_MAX_CONNS (default 4)
// connections, so that concurrent Lambda instances do not exhaust the database.
func PoolConfig(url string, getenv Getenv) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = 4
	if v := getenv(DatabaseMaxConns); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s must be a positive integer, got %q", DatabaseMaxConns, v)
		}
		cfg.MaxConns = int32(n)
	}
	cfg.MaxConnIdleTime = 5 * time.Minute
	return cfg, nil
}

// Topics reads SLUICE_TOPIC_ARNS (a JSON object of logical topic → SNS topic ARN) and
// SLUICE_DEFAULT_TOPIC_ARN.
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
		awsCfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return "", fmt.Errorf("load AWS config: %w", err)
		}
		secrets = secretsmanager.NewFromConfig(awsCfg)
	}
	return DatabaseURLFrom(ctx, getenv, secrets)
}

// OpenPool resolves the database URL (ResolveDatabaseURL) and opens a pool capped at
// DATABASE_MAX_CONNS connections: what every sluice Lambda does once per cold start.
func OpenPool(ctx context.Context, getenv Getenv) (*pgxpool.Pool, error) {
	url, err := ResolveDatabaseURL(ctx, getenv)
	if err != nil {
		return nil, err
	}
	cfg, err := PoolConfig(url, getenv)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create database pool: %w", err)
	}
	return pool, nil
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
