package lambdaenv

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/stretchr/testify/require"
)

func env(m map[string]string) Getenv { return func(k string) string { return m[k] } }

// fixedSecret returns one secret: the Secrets Manager response shape, not a database stand-in.
type fixedSecret string

func (s fixedSecret) GetSecretValue(context.Context, *secretsmanager.GetSecretValueInput, ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	return &secretsmanager.GetSecretValueOutput{SecretString: aws.String(string(s))}, nil
}

func TestDatabaseURLPrefersDatabaseURLThenBuildsFromTheRDSSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := DatabaseURLFrom(ctx, env(map[string]string{DatabaseURL: "postgres://a@b/c"}), nil)
	require.NoError(t, err)
	require.Equal(t, "postgres://a@b/c", u)

	secret := fixedSecret(`{"host":"db.internal","port":5432,"username":"sluice","password":"p@ss/word","dbname":"app","engine":"postgres"}`)
	u, err = DatabaseURLFrom(ctx, env(map[string]string{DatabaseSecretARN: "arn:secret"}), secret)
	require.NoError(t, err)
	require.Equal(t, "postgres://sluice:p%40ss%2Fword@db.internal:5432/app?sslmode=verify-full", u, "TLS verified by default")

	u, err = DatabaseURLFrom(ctx, env(map[string]string{DatabaseSecretARN: "arn:secret", DatabaseSSLRootCert: "/opt/sluice/rds-ca-bundle.pem",
		DatabaseHost: "proxy.internal", DatabasePort: "6432"}), secret)
	require.NoError(t, err)
	require.Equal(t, "postgres://sluice:p%40ss%2Fword@proxy.internal:6432/app?sslmode=verify-full&sslrootcert=%2Fopt%2Fsluice%2Frds-ca-bundle.pem", u)

	_, err = DatabaseURLFrom(ctx, env(nil), nil)
	require.ErrorContains(t, err, "no database configured")
	_, err = DatabaseURLFrom(ctx, env(map[string]string{DatabaseSecretARN: "arn:secret"}), fixedSecret(`not json`))
	require.ErrorContains(t, err, "not RDS secret JSON")
}

func TestTopicsAndDurations(t *testing.T) {
	t.Parallel()
	topics, def, err := Topics(env(map[string]string{TopicARNs: `{"orders":"arn:orders"}`}))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"orders": "arn:orders"}, topics)
	require.Empty(t, def)
	_, _, err = Topics(env(map[string]string{TopicARNs: `["x"]`}))
	require.ErrorContains(t, err, TopicARNs)
	_, _, err = Topics(env(nil))
	require.ErrorContains(t, err, "no SNS topic configured")

	d, err := Duration(env(nil), RelayStopBefore, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, d)
	_, err = Duration(env(map[string]string{RelayStopBefore: "soon"}), RelayStopBefore, 0)
	require.ErrorContains(t, err, "soon")

	cfg, err := PoolConfig("postgres://a@localhost/db", env(map[string]string{DatabaseMaxConns: "7"}))
	require.NoError(t, err)
	require.Equal(t, int32(7), cfg.MaxConns)
	_, err = PoolConfig("postgres://a@localhost/db", env(map[string]string{DatabaseMaxConns: "0"}))
	require.ErrorContains(t, err, DatabaseMaxConns)
}

func TestLoggerLevelFromTheEnvironment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.True(t, Logger(env(map[string]string{LogLevel: "debug"}), "relay").Enabled(ctx, slog.LevelDebug))
	require.False(t, Logger(env(nil), "relay").Enabled(ctx, slog.LevelDebug), "info by default")
	require.False(t, Logger(env(map[string]string{LogLevel: "loud"}), "relay").Enabled(ctx, slog.LevelDebug), "unknown level: info")
	require.False(t, Logger(env(map[string]string{LogLevel: "warn"}), "relay").Enabled(ctx, slog.LevelInfo))
}
