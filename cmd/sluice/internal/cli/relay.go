package cli

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func (a *app) relayCommand() *cobra.Command {
	var (
		once         bool
		topicFlags   []string
		defaultTopic string
		batchSize    int
	)
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed outbox rows to SNS from this machine",
		Long: fmt.Sprintf(`Run the outbox relay in-process, with the configuration the relay Lambda reads from the
environment: SLUICE_TOPIC_ARNS (a JSON object of topic name to SNS topic ARN),
SLUICE_DEFAULT_TOPIC_ARN, and the relay settings (defaults in brackets):
  %s [%d]  %s [%d]  %s [%d]  %s [%d]
  %s [%s]  %s [%s]  %s [%s]  %s [%s]  %s [%s]
  %s [%s]  %s [%s]  %s [%d]  %s [16 MiB]
A setting out of range is refused with an error naming it. --topic, --default-topic and
--batch-size override the environment.

With --once it drains every claimable row and exits (rows in backoff, quarantined, behind such a
row, held by another relay, or of a destination that fails as a whole are left); otherwise it
keeps relaying until interrupted (Ctrl-C). It is safe to run next to the relay Lambda: each
relay round holds its partition keys' locks.`,
			lambdaenv.RelayBatchSize, outbox.DefaultBatchSize, lambdaenv.RelayMaxPerKey, outbox.DefaultMaxPerKey,
			lambdaenv.RelayPublishConcurrency, outbox.DefaultPublishConcurrency, lambdaenv.RelayPipelines, outbox.DefaultPipelines,
			lambdaenv.RelayPublishTimeout, outbox.DefaultPublishTimeout, lambdaenv.RelayLease, outbox.DefaultLease,
			lambdaenv.RelayBackoffBase, outbox.DefaultBackoffBase, lambdaenv.RelayBackoffMax, outbox.DefaultBackoffMax,
			lambdaenv.RelayOutageLimit, outbox.DefaultOutageLimit, lambdaenv.RelayPollInterval, outbox.DefaultPollInterval,
			lambdaenv.RelayRescanInterval, outbox.DefaultRescanInterval, lambdaenv.RelayMaxAttempts, outbox.DefaultMaxAttempts,
			lambdaenv.RelayMaxRoundBytes),
		Example: `  sluice relay --once --topic orders=arn:aws:sns:eu-west-1:123456789012:orders
  SLUICE_TOPIC_ARNS='{"orders":"arn:aws:sns:eu-west-1:123456789012:orders"}' sluice relay`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if cmd.Flags().Changed("batch-size") && (batchSize < 1 || batchSize > outbox.MaxBatchSize) {
				return usagef("--batch-size must be between 1 and %d, got %d", outbox.MaxBatchSize, batchSize)
			}
			relayCfg, err := a.relayConfig(topicFlags, defaultTopic)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("batch-size") {
				relayCfg.BatchSize = batchSize
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			cfg, err := a.awsConfig(ctx)
			if err != nil {
				return err
			}
			relayCfg.Publisher = outbox.NewSNSPublisher(sns.NewFromConfig(cfg))
			relayCfg.Logger = slog.New(slog.NewTextHandler(a.io.Err, &slog.HandlerOptions{Level: slog.LevelWarn}))
			r, err := outbox.NewRelay(pool, relayCfg)
			if err != nil {
				return err
			}
			if once {
				st, err := r.RunOnce(ctx)
				fmt.Fprintf(a.io.Out, "published %d, retrying %d, destination outage %d, quarantined %d (claimed %d in %d rounds)\n",
					st.Published, st.Retrying, st.Outage, st.Quarantined, st.Claimed, st.Rounds)
				for _, d := range r.DestinationsDown() {
					fmt.Fprintf(a.io.Err, "destination %s fails as a whole since %s: %s\n", d.Destination, d.Since.Format(time.RFC3339), d.LastError)
				}
				if err != nil {
					return fmt.Errorf("relay: %w", err)
				}
				if st.Quarantined > 0 {
					fmt.Fprintln(a.io.Err, "some rows were quarantined: see `sluice dead list`")
				}
				return nil
			}
			fmt.Fprintln(a.io.Err, "relaying until interrupted (Ctrl-C)")
			return r.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&once, "once", false, "drain the outbox and exit")
	f.StringArrayVar(&topicFlags, "topic", nil, "NAME=ARN topic mapping (repeatable; overrides $SLUICE_TOPIC_ARNS entries)")
	f.StringVar(&defaultTopic, "default-topic", "", "SNS topic ARN for rows whose topic is not mapped (default $SLUICE_DEFAULT_TOPIC_ARN)")
	f.IntVar(&batchSize, "batch-size", 0, fmt.Sprintf("rows per round (default $%s, else %d)", lambdaenv.RelayBatchSize, outbox.DefaultBatchSize))
	return cmd
}

// relayConfig reads the relay's settings as the Lambda does (lambdaenv.RelaySettings) and the
// topics from the environment with the flags applied on top.
func (a *app) relayConfig(topicFlags []string, defaultTopic string) (outbox.RelayConfig, error) {
	topics, def, err := relayTopics(a.io.Getenv, topicFlags, defaultTopic)
	if err != nil {
		return outbox.RelayConfig{}, err
	}
	cfg, err := lambdaenv.RelaySettings(a.io.Getenv)
	if err != nil {
		return outbox.RelayConfig{}, err
	}
	cfg.Topics, cfg.DefaultTopic = topics, def
	return cfg, nil
}

// relayTopics merges the Lambda's environment configuration with the flags (flags win).
func relayTopics(getenv func(string) string, flags []string, defaultTopic string) (map[string]string, string, error) {
	topics, def, err := lambdaenv.Topics(getenv)
	if err != nil && len(flags) == 0 && defaultTopic == "" {
		return nil, "", fmt.Errorf("%w (or pass --topic NAME=ARN / --default-topic ARN)", err)
	}
	if topics == nil {
		topics = map[string]string{}
		// Topics fails only when nothing is configured or the JSON is malformed; report the latter.
		if raw := getenv(lambdaenv.TopicARNs); raw != "" {
			return nil, "", err
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
