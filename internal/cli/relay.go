package cli

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/lambdaenv"
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
		Long: `Run the outbox relay in-process, with the configuration the relay Lambda reads:
SLUICE_TOPIC_ARNS (a JSON object of topic name to SNS topic ARN), SLUICE_DEFAULT_TOPIC_ARN and
SLUICE_RELAY_BATCH_SIZE. --topic and --default-topic override them.

With --once it drains every claimable row and exits (rows in backoff, quarantined, or leased by
another relay are left); otherwise it keeps relaying until interrupted (Ctrl-C). It is safe to run
next to the relay Lambda: relays lease rows with SKIP LOCKED.`,
		Example: `  sluice relay --once --topic orders=arn:aws:sns:eu-west-1:123456789012:orders
  SLUICE_TOPIC_ARNS='{"orders":"arn:aws:sns:eu-west-1:123456789012:orders"}' sluice relay`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			topics, def, err := relayTopics(a.io.Getenv, topicFlags, defaultTopic)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("batch-size") {
				if v := a.io.Getenv(lambdaenv.RelayBatchSize); v != "" {
					if batchSize, err = strconv.Atoi(v); err != nil || batchSize < 1 {
						return fmt.Errorf("%s must be a positive integer, got %q", lambdaenv.RelayBatchSize, v)
					}
				}
			} else if batchSize < 1 {
				return usagef("--batch-size must be positive, got %d", batchSize)
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			cfg, err := a.awsConfig(ctx)
			if err != nil {
				return err
			}
			logger := slog.New(slog.NewTextHandler(a.io.Err, &slog.HandlerOptions{Level: slog.LevelWarn}))
			r, err := outbox.NewRelay(pool, outbox.RelayConfig{
				Publisher:    outbox.NewSNSPublisher(sns.NewFromConfig(cfg)),
				Topics:       topics,
				DefaultTopic: def,
				BatchSize:    batchSize,
				Logger:       logger,
			})
			if err != nil {
				return err
			}
			if once {
				st, err := r.RunOnce(ctx)
				fmt.Fprintf(a.io.Out, "published %d, retrying %d, quarantined %d (claimed %d in %d rounds)\n",
					st.Published, st.Retrying, st.Quarantined, st.Claimed, st.Rounds)
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
	f.IntVar(&batchSize, "batch-size", 0, "rows per claim (default $SLUICE_RELAY_BATCH_SIZE, else 1000)")
	return cmd
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
