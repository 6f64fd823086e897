package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func (a *app) relayCommand() *cobra.Command {
	var opts RelayOptions
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed outbox rows to their destinations from this machine",
		Long: fmt.Sprintf(`Run the outbox relay in-process, with the configuration the relay Lambda reads from the
environment: SLUICE_TOPIC_ARNS (a JSON object of topic name to destination: an SNS topic,
EventBridge bus or Kinesis stream ARN, or a Kafka topic as kafka://TOPIC),
SLUICE_DEFAULT_TOPIC_ARN, and the relay settings (defaults in brackets):
  %s [%d]  %s [%d]  %s [%d]  %s [%d]
  %s [%s]  %s [%s]  %s [%s]  %s [%s]  %s [%s]
  %s [%s]  %s [%s]  %s [%d]  %s [%s]
and each destination's largest message, in bytes as its service counts it (AWS's current limits;
set them to what your topics, queues, streams and brokers take, docs/destinations.md):
  %s [%d]  %s [%d]  %s [%d]
  %s [%d]  %s [%d]
A setting out of range is refused with an error naming it. --topic, --default-topic and
--batch-size override the environment. The settings it runs with are printed on stderr.

With --once it drains every claimable row and exits (rows in backoff, quarantined, behind such a
row, held by another relay, or of a destination that fails as a whole are left); otherwise it
keeps relaying until interrupted (Ctrl-C). It is safe to run next to the relay Lambda: a
partition key is one relay round's at a time (an advisory lock per key).`,
			lambdaenv.RelayBatchSize, outbox.DefaultBatchSize, lambdaenv.RelayMaxPerKey, outbox.DefaultMaxPerKey,
			lambdaenv.RelayPublishConcurrency, outbox.DefaultPublishConcurrency, lambdaenv.RelayPipelines, outbox.DefaultPipelines,
			lambdaenv.RelayPublishTimeout, outbox.DefaultPublishTimeout, lambdaenv.RelayLease, outbox.DefaultLease,
			lambdaenv.RelayBackoffBase, outbox.DefaultBackoffBase, lambdaenv.RelayBackoffMax, outbox.DefaultBackoffMax,
			lambdaenv.RelayOutageLimit, outbox.DefaultOutageLimit, lambdaenv.RelayPollInterval, outbox.DefaultPollInterval,
			lambdaenv.RelayRescanInterval, outbox.DefaultRescanInterval, lambdaenv.RelayMaxAttempts, outbox.DefaultMaxAttempts,
			lambdaenv.RelayMaxRoundBytes, formatBytes(outbox.DefaultMaxRoundBytes),
			lambdaenv.SNSMaxMessageBytes, outbox.DefaultSNSMaxMessageBytes, lambdaenv.SQSMaxMessageBytes, outbox.DefaultSQSMaxMessageBytes,
			lambdaenv.EventBridgeMaxEntryBytes, outbox.DefaultEventBridgeMaxEntryBytes,
			lambdaenv.KinesisMaxRecordBytes, outbox.DefaultKinesisMaxRecordBytes, lambdaenv.KafkaMaxMessageBytes, outbox.DefaultKafkaMaxMessageBytes),
		Example: `  sluice relay --once --topic orders=arn:aws:sns:eu-west-1:123456789012:orders
  SLUICE_TOPIC_ARNS='{"orders":"arn:aws:sns:eu-west-1:123456789012:orders"}' sluice relay`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			opts.Getenv = a.io.Getenv
			opts.Logger = slog.New(slog.NewTextHandler(a.io.Err, &slog.HandlerOptions{Level: slog.LevelWarn}))
			// Refuse bad settings before connecting to anything.
			cfg, err := RelaySettings(opts)
			if err != nil {
				return err
			}
			fmt.Fprintln(a.io.Err, "relay settings (defaults included): "+describeRelaySettings(cfg))
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			awsCfg, err := a.awsConfig(ctx)
			if err != nil {
				return err
			}
			if !opts.Once {
				fmt.Fprintln(a.io.Err, "relaying until interrupted (Ctrl-C)")
			}
			pub, closePub, err := lambdaenv.RelayPublisher(ctx, opts.Getenv, awsCfg, cfg.Destinations())
			if err != nil {
				return usageError{err}
			}
			defer closePub()
			if opts.ClaimCheck, err = lambdaenv.ClaimCheck(opts.Getenv, awsCfg); err != nil {
				return usageError{err}
			}
			res, err := Relay(ctx, pool, pub, opts)
			if opts.Once {
				st := res.Stats
				fmt.Fprintf(a.io.Out, "published %d, retrying %d, destination outage %d, quarantined %d (claimed %d in %d rounds)\n",
					st.Published, st.Retrying, st.Outage, st.Quarantined, st.Claimed, st.Rounds)
				for _, d := range res.DestinationsDown {
					fmt.Fprintf(a.io.Err, "destination %s fails as a whole since %s: %s\n", d.Destination, d.Since.Format(time.RFC3339), d.LastError)
				}
				if err == nil && st.Quarantined > 0 {
					fmt.Fprintln(a.io.Err, "some rows were quarantined: see `sluice dead list`")
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&opts.Once, "once", false, "drain the outbox and exit")
	f.StringArrayVar(&opts.Topics, "topic", nil, "NAME=ARN topic mapping (repeatable; overrides $SLUICE_TOPIC_ARNS entries)")
	f.StringVar(&opts.DefaultTopic, "default-topic", "", "destination (SNS topic, EventBridge bus or Kinesis stream ARN, or a Kafka topic as kafka://TOPIC) for rows whose topic is not mapped (default $SLUICE_DEFAULT_TOPIC_ARN)")
	f.IntVar(&opts.BatchSize, "batch-size", 0, fmt.Sprintf("rows per round, 1 to %d (default $%s, else %d)", outbox.MaxBatchSize, lambdaenv.RelayBatchSize, outbox.DefaultBatchSize))
	return cmd
}

// RelayOptions configure Relay. The relay's configuration is the relay Lambda's, read from the
// environment by lambdaenv (the topics and every SLUICE_RELAY_* setting), with these options
// on top.
type RelayOptions struct {
	// Getenv reads the environment. Defaults to os.Getenv.
	Getenv func(string) string
	// Topics are NAME=ARN mappings, added to SLUICE_TOPIC_ARNS' and replacing its entries of the
	// same names. Defaults to none.
	Topics []string
	// DefaultTopic replaces SLUICE_DEFAULT_TOPIC_ARN when set.
	DefaultTopic string
	// BatchSize replaces SLUICE_RELAY_BATCH_SIZE when not 0: 1 to outbox.MaxBatchSize.
	BatchSize int
	// Once drains every claimable row and returns (outbox.Relay.RunOnce); otherwise Relay runs
	// until ctx ends (outbox.Relay.Run).
	Once bool
	// Logger receives the relay's logs. Defaults to discarding them.
	Logger *slog.Logger
	// ClaimCheck stores payloads too large for their destination in S3 (lambdaenv.ClaimCheck
	// reads it from SLUICE_CLAIM_CHECK_*). Defaults to none.
	ClaimCheck *outbox.ClaimCheck
}

// RelayResult is what Relay ran with and did.
type RelayResult struct {
	// Config is the configuration the relay ran with, outbox's defaults applied (Publisher and
	// Logger included).
	Config outbox.RelayConfig
	// Stats counts what the drain did (Once only; Run reports through logs and metrics).
	Stats outbox.Stats
	// DestinationsDown are the destinations the relay was backing off as a whole when it returned.
	DestinationsDown []outbox.DestinationOutage
}

// RelaySettings builds the relay's configuration (without Publisher and Logger) as Relay does:
// the environment as the relay Lambda reads it (lambdaenv.Topics and lambdaenv.RelaySettings),
// then opts' topics and batch size, outbox's defaults applied. A bad setting or option is
// ErrUsage, naming the variable or flag.
func RelaySettings(opts RelayOptions) (outbox.RelayConfig, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if opts.BatchSize != 0 && (opts.BatchSize < 1 || opts.BatchSize > outbox.MaxBatchSize) {
		return outbox.RelayConfig{}, usagef("--batch-size must be between 1 and %d, got %d", outbox.MaxBatchSize, opts.BatchSize)
	}
	topics, def, err := relayTopics(getenv, opts.Topics, opts.DefaultTopic)
	if err != nil {
		return outbox.RelayConfig{}, err
	}
	cfg, err := lambdaenv.RelaySettings(getenv)
	if err != nil {
		return outbox.RelayConfig{}, usageError{err}
	}
	cfg.Topics, cfg.DefaultTopic = topics, def
	if opts.BatchSize != 0 {
		cfg.BatchSize = opts.BatchSize
	}
	return cfg.WithDefaults(), nil
}

// Relay runs the outbox relay in this process with pub as the broker: a drain with opts.Once,
// otherwise until ctx ends. See the command's help.
func Relay(ctx context.Context, pool *pgxpool.Pool, pub outbox.Publisher, opts RelayOptions) (RelayResult, error) {
	cfg, err := RelaySettings(opts)
	if err != nil {
		return RelayResult{}, err
	}
	if pub == nil {
		return RelayResult{}, fmt.Errorf("cli: Relay needs a publisher")
	}
	cfg.Publisher, cfg.Logger, cfg.ClaimCheck = pub, opts.Logger, opts.ClaimCheck
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	res := RelayResult{Config: cfg}
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		return res, err
	}
	if opts.Once {
		res.Stats, err = r.RunOnce(ctx)
	} else {
		err = r.Run(ctx)
	}
	res.DestinationsDown = r.DestinationsDown()
	if err != nil {
		return res, fmt.Errorf("relay: %w", err)
	}
	return res, nil
}

// describeRelaySettings lists cfg's settings as the environment variables that would set them.
func describeRelaySettings(cfg outbox.RelayConfig) string {
	env := lambdaenv.RelayEnvironment(cfg)
	parts := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		parts = append(parts, k+"="+env[k])
	}
	return strings.Join(parts, " ")
}

// formatBytes renders a byte count in the largest binary unit that divides it: 16 MiB, 64 KiB.
func formatBytes(n int) string {
	for _, u := range []struct {
		shift int
		name  string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// relayTopics merges the Lambda's environment configuration with the flags (flags win).
func relayTopics(getenv func(string) string, flags []string, defaultTopic string) (map[string]string, string, error) {
	topics, def, err := lambdaenv.Topics(getenv)
	if err != nil && len(flags) == 0 && defaultTopic == "" {
		return nil, "", usageError{fmt.Errorf("%w (or pass --topic NAME=ARN / --default-topic ARN)", err)}
	}
	if topics == nil {
		topics = map[string]string{}
		// Topics fails only when nothing is configured or the JSON is malformed; report the latter.
		if raw := getenv(lambdaenv.TopicARNs); raw != "" {
			return nil, "", usageError{err}
		}
		def = getenv(lambdaenv.DefaultTopicARN)
	}
	for _, kv := range flags {
		name, arn, ok := strings.Cut(kv, "=")
		if !ok || name == "" || arn == "" {
			return nil, "", usagef("--topic %q: want NAME=ARN", kv)
		}
		topics[name] = arn
	}
	if defaultTopic != "" {
		def = defaultTopic
	}
	return topics, def, nil
}
