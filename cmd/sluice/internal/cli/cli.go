// Package cli implements the sluice operator command line: migrate, relay, status, dead,
// redrive, replay, purge, partition, audit and fleet (migrate --fleet and status --fleet work
// on every tenant database of a fleet). cmd/sluice is a thin main around [Run].
//
// Connection settings resolve with the same precedence everywhere: a flag wins over the
// environment, which wins over the default.
//
//	--database-url   DATABASE_URL (or DATABASE_SECRET_ARN, an RDS secret, as the Lambdas read it)
//	--endpoint-url   AWS_ENDPOINT_URL      (default: the AWS endpoint of the region)
//	--region         AWS_REGION, then AWS_DEFAULT_REGION (default: us-east-1)
//
// Exit codes: 0 success, 1 failure (the error names the problem), 2 bad usage.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// Environment variable names the CLI reads (besides those of pkg/lambdaenv).
const (
	EnvEndpointURL   = "AWS_ENDPOINT_URL"
	EnvRegion        = "AWS_REGION"
	EnvDefaultRegion = "AWS_DEFAULT_REGION"
	// DefaultRegion is used when neither --region nor the environment names one.
	DefaultRegion = "us-east-1"
)

// Exit codes returned by Run.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// IO is the process around the CLI: its streams and environment. Tests pass buffers and a map.
type IO struct {
	In       io.Reader
	Out, Err io.Writer
	// Getenv reads the environment. Defaults to os.Getenv.
	Getenv func(string) string
	// IsTerminal reports whether a stream is an interactive terminal. Defaults to checking
	// *os.File streams with golang.org/x/term.
	IsTerminal func(any) bool
	// Hooks lets tests wrap AWS clients (e.g. to interrupt a redrive at a chosen point).
	// Nil in production.
	Hooks *Hooks
}

// Hooks are test seams. Every field is optional.
type Hooks struct {
	// WrapSQS wraps the SQS client the commands use.
	WrapSQS func(SQSAPI) SQSAPI
	// Secrets replaces the Secrets Manager client that reads the secrets of a fleet's tenants
	// and registry.
	Secrets lambdaenv.SecretGetter
}

func (o *IO) withDefaults() {
	if o.In == nil {
		o.In = strings.NewReader("")
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Err == nil {
		o.Err = io.Discard
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.IsTerminal == nil {
		o.IsTerminal = func(s any) bool {
			f, ok := s.(*os.File)
			return ok && term.IsTerminal(int(f.Fd()))
		}
	}
}

// ErrUsage marks bad usage (an unknown command or flag, a malformed value, a missing or
// contradictory option): Run exits with ExitUsage, and nothing was changed. Errors of the
// exported command functions (Redrive, RetryDead, ...) wrap it when their options are wrong.
var ErrUsage = errors.New("bad usage")

// usageError is bad usage with its own message; errors.Is(err, ErrUsage) holds.
type usageError struct{ err error }

func (e usageError) Error() string        { return e.err.Error() }
func (e usageError) Unwrap() error        { return e.err }
func (e usageError) Is(target error) bool { return target == ErrUsage }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// usageArgs marks every error of cobra's own checks of a command's arguments (unknown command,
// wrong number of arguments) as bad usage, so that no error text has to be recognised.
func usageArgs(cmd *cobra.Command) {
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return usageError{fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		usageArgs(sub)
	}
}

// app holds the resolved global flags and the lazily opened connections of one invocation.
type app struct {
	io          IO
	databaseURL string
	endpointURL string
	region      string
	pool        *pgxpool.Pool
	awsCfg      *aws.Config
}

// Run executes the sluice command line args (without the program name) and returns the exit
// code. Errors are printed to io.Err as one line starting with "sluice: ".
func Run(ctx context.Context, args []string, streams IO) int {
	streams.withDefaults()
	a := &app{io: streams}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.Err)
	err := root.ExecuteContext(ctx)
	if a.pool != nil {
		a.pool.Close()
	}
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(streams.Err, "sluice: "+oneLine(explain(err)))
	if errors.Is(err, ErrUsage) {
		return ExitUsage
	}
	return ExitError
}

// explain adds the operator's next step to errors whose cause is well known.
func explain(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42P01" {
		return err.Error() + " (is the database migrated? run `sluice migrate up`)"
	}
	return err.Error()
}

// oneLine folds a possibly multi-line error message into one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\r", "")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ; ")), " ")
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "sluice",
		Short: "Operate a sluice transactional outbox and inbox",
		Long: `sluice operates the transactional outbox (outbox_event → SNS, EventBridge, Kinesis or Kafka)
and inbox (SQS, Kinesis or Kafka → inbox_event) of a service: schema migrations, the relay,
status for alarms, quarantined and parked rows, DLQ redrive, replay and retention; for a fleet
of tenant databases, the registry (sluice fleet), migrate --fleet and status --fleet.

Connection settings (a flag wins over the environment, which wins over the default):
  --database-url   DATABASE_URL, or DATABASE_SECRET_ARN (an RDS Secrets Manager secret)
  --endpoint-url   AWS_ENDPOINT_URL (e.g. http://localhost:4566 for LocalStack or fauxqs)
  --region         AWS_REGION, then AWS_DEFAULT_REGION, then us-east-1

Durations accept Go durations plus a day suffix: 90s, 15m, 36h, 7d, 1d12h.
Timestamps accept RFC 3339 (2026-11-28T09:00:00Z), a date (2026-11-28, midnight UTC),
"now", or a time relative to now (-2h, -7d).

Exit codes: 0 success, 1 failure, 2 bad usage. Errors are one line on stderr.`,
		Example: `  sluice status
  sluice status --json --queue https://sqs.eu-west-1.amazonaws.com/123456789012/orders
  sluice dead list
  sluice redrive --dlq https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL, or the RDS secret named by $DATABASE_SECRET_ARN)")
	pf.StringVar(&a.endpointURL, "endpoint-url", "", "AWS endpoint for every AWS service the command calls: SQS, SNS, EventBridge, Kinesis, S3, Secrets Manager; Kafka brokers are not reached through it (default $AWS_ENDPOINT_URL, else AWS)")
	pf.StringVar(&a.region, "region", "", "AWS region (default $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1)")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
	})
	root.AddCommand(a.migrateCommand(), a.relayCommand(), a.statusCommand(), a.deadCommand(),
		a.redriveCommand(), a.replayCommand(), a.purgeCommand(), a.partitionCommand(), a.auditCommand(), a.fleetCommand())
	readsOnly(root)
	usageArgs(root)
	return root
}

// resolvedRegion applies flag > AWS_REGION > AWS_DEFAULT_REGION > DefaultRegion.
func (a *app) resolvedRegion() string {
	for _, r := range []string{a.region, a.io.Getenv(EnvRegion), a.io.Getenv(EnvDefaultRegion)} {
		if r != "" {
			return r
		}
	}
	return DefaultRegion
}

// resolvedEndpoint applies flag > AWS_ENDPOINT_URL > "" (the SDK's AWS endpoints).
func (a *app) resolvedEndpoint() string {
	if a.endpointURL != "" {
		return a.endpointURL
	}
	return a.io.Getenv(EnvEndpointURL)
}

// awsConfig loads the SDK configuration once per invocation.
func (a *app) awsConfig(ctx context.Context) (aws.Config, error) {
	if a.awsCfg != nil {
		return *a.awsCfg, nil
	}
	opts := []func(*config.LoadOptions) error{
		config.WithRegion(a.resolvedRegion()),
		config.WithRetryer(func() aws.Retryer { return retry.AddWithMaxAttempts(retry.NewStandard(), 3) }),
	}
	if ep := a.resolvedEndpoint(); ep != "" {
		if u, err := url.Parse(ep); err != nil || u.Scheme == "" || u.Host == "" {
			return aws.Config{}, usagef("--endpoint-url %q is not a URL such as http://localhost:4566", ep)
		}
		opts = append(opts, config.WithBaseEndpoint(ep))
		if a.io.Getenv("AWS_ACCESS_KEY_ID") == "" && a.io.Getenv("AWS_PROFILE") == "" {
			// Local emulators ignore credentials; spare the operator from inventing some.
			opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
		}
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS configuration: %w", err)
	}
	a.awsCfg = &cfg
	return cfg, nil
}

// databaseURLResolved applies --database-url > DATABASE_URL > DATABASE_SECRET_ARN.
func (a *app) databaseURLResolved(ctx context.Context) (string, error) {
	if a.databaseURL != "" {
		return a.databaseURL, nil
	}
	var secrets lambdaenv.SecretGetter
	if a.io.Getenv(lambdaenv.DatabaseURL) == "" && a.io.Getenv(lambdaenv.DatabaseSecretARN) != "" {
		cfg, err := a.awsConfig(ctx)
		if err != nil {
			return "", err
		}
		secrets = secretsmanager.NewFromConfig(cfg)
	}
	u, err := lambdaenv.DatabaseURLFrom(ctx, a.io.Getenv, secrets)
	if err != nil {
		return "", fmt.Errorf("%w (or pass --database-url)", err)
	}
	return u, nil
}

// db opens (once) and pings the database pool.
func (a *app) db(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	u, err := a.databaseURLResolved(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := a.openPool(ctx, u)
	if err != nil {
		return nil, err
	}
	a.pool = pool
	return pool, nil
}

// openPool opens and pings a pool on the database at u.
func (a *app) openPool(ctx context.Context, u string) (*pgxpool.Pool, error) {
	cfg, err := lambdaenv.PoolConfig(u, a.io.Getenv)
	if err != nil {
		return nil, usagef("database URL %s: %v", redact(u), unwrapParse(err))
	}
	return openPoolConfig(ctx, cfg, u)
}

// openPoolConfig opens and pings a pool of cfg, u being its URL (shown without its password).
func openPoolConfig(ctx context.Context, cfg *pgxpool.Config, u string) (*pgxpool.Pool, error) {
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > 10*time.Second {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", redact(u), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach the database %s: %s", redact(u), firstLine(rootCause(err).Error()))
	}
	return pool, nil
}

// rootCause returns the innermost error of a chain (for connection errors, the dial or
// authentication failure rather than pgx's per-address summary).
func rootCause(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// unwrapParse drops pgx's echo of the full connection string (which may hold a password).
func unwrapParse(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if pe.Unwrap() != nil {
			return errors.New(pe.Unwrap().Error())
		}
		return errors.New("cannot parse the connection string")
	}
	return err
}

// redact shows where a database URL points without its password.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Scheme == "" {
		return "(connection string)"
	}
	return p.Redacted()
}
