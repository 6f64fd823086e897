package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
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
		Long: `Run the outbox relay in-process, with the configuration the relay Lambda reads from the
environment: SLUICE_TOPIC_ARNS (a JSON object of topic name to destination: an SNS topic,
EventBridge bus or Kinesis stream ARN, or a Kafka topic as kafka://TOPIC), SLUICE_DEFAULT_TOPIC_ARN, and the
relay settings (outbox.RelaySettings, docs/outbox.md; defaults in brackets; the message limits
are bytes as each service counts them, AWS's current limits: set them to what your topics,
queues, streams and brokers take, docs/destinations.md):
` + relaySettingsHelp() + `
A setting out of range is refused with an error naming it. --topic, --default-topic and the
flags below override the environment. The settings it runs with are printed on stderr.

With --once it drains every claimable row and exits (rows in backoff, quarantined, behind such a
row, held by another relay, or of a destination that fails as a whole are left); otherwise it
keeps relaying until interrupted (Ctrl-C). It is safe to run next to the relay Lambda: a
partition key is one relay round's at a time (an advisory lock per key).`,
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
	for _, s := range outbox.RelaySettings() {
		if s.Flag != "" {
			f.Var(settingFlag{s, &opts.Settings}, s.Flag, fmt.Sprintf("%s, %s to %s (default $%s, else %s)",
				s.Doc, s.Format(s.Min), s.Format(s.Max), s.Env, s.Format(s.Default)))
		}
	}
	unguarded(cmd, "publishes the outbox's pending rows, the work the relay Lambda does all the time; it deletes and rewinds nothing")
	return cmd
}

// relaySettingsHelp lists the variable and default of every setting in outbox.RelaySettings
// that has one, a few to a line.
func relaySettingsHelp() string {
	var b strings.Builder
	line := 0
	for _, s := range outbox.RelaySettings() {
		if s.Env == "" {
			continue
		}
		def := s.Format(s.Default)
		if s.Default == 0 {
			def = "unset"
		}
		item := fmt.Sprintf("%s [%s]", s.Env, def)
		if line > 0 && line+2+len(item) > 98 {
			b.WriteString("\n")
			line = 0
		}
		b.WriteString("  " + item)
		line += 2 + len(item)
	}
	return b.String()
}

// settingFlag is the flag of a setting: its value goes to Settings[s.Field].
type settingFlag struct {
	s        outbox.Setting
	settings *map[string]int64
}

func (f settingFlag) String() string {
	if v, ok := (*f.settings)[f.s.Field]; ok {
		return f.s.Text(v)
	}
	return ""
}

func (f settingFlag) Set(text string) error {
	v, err := f.s.Parse(text)
	if err != nil {
		return err
	}
	if *f.settings == nil {
		*f.settings = map[string]int64{}
	}
	(*f.settings)[f.s.Field] = v
	return nil
}

func (f settingFlag) Type() string {
	if f.s.Unit == "duration" {
		return "duration"
	}
	return "int"
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
	// Settings replace the environment's settings, by outbox.Setting.Field ("BatchSize": 100);
	// the flags of the settings that have one (--batch-size) fill it. Defaults to none.
	Settings map[string]int64
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
// then opts' topics and settings, outbox's defaults applied. A bad setting or option is
// ErrUsage, naming the variable, flag or field.
func RelaySettings(opts RelayOptions) (outbox.RelayConfig, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	for _, s := range outbox.RelaySettings() {
		v, ok := opts.Settings[s.Field]
		if !ok {
			continue
		}
		if err := s.Check(v); err != nil {
			if s.Flag != "" {
				return outbox.RelayConfig{}, usagef("--%s: %v", s.Flag, err)
			}
			return outbox.RelayConfig{}, usageError{err}
		}
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
	for _, s := range outbox.RelaySettings() {
		if v, ok := opts.Settings[s.Field]; ok {
			s.Set(&cfg, v)
		}
	}
	if err := cfg.CheckSettings(); err != nil { // with the environment's, e.g. PublishTimeout against Lease
		return outbox.RelayConfig{}, usageError{err}
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
	var parts []string
	for _, s := range outbox.RelaySettings() {
		if v := s.Get(cfg); s.Env != "" && v != 0 {
			parts = append(parts, s.Env+"="+s.Text(v))
		}
	}
	return strings.Join(parts, " ")
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
