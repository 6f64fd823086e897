package localrun

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// KafkaStackOptions configure a KafkaStack: the demo pipeline on Kafka, with the real relay
// binary publishing to kafka://TOPIC and the demo's ledger consumer behind a KafkaEventSource.
type KafkaStackOptions struct {
	// RIE is the emulator binary and BinDir holds <fn>/bootstrap built for this machine. Required.
	RIE, BinDir string
	// DatabaseURL is the migrated database both functions use. Required.
	DatabaseURL string
	// Brokers are the Kafka bootstrap brokers (a KafkaCluster's). Required.
	Brokers []string
	// Topic is the Kafka topic demoapp.Topic maps to. Defaults to demoapp.Topic.
	Topic string
	// Group is the event source's consumer group. Defaults to "sluice-ledger".
	Group string
	// RelayInstances and ConsumerInstances are each function's concurrency. Default to 2.
	RelayInstances, ConsumerInstances int
	// RelayTimeout and RelayEvery are as in StackOptions. Default to 10s and 4s.
	RelayTimeout, RelayEvery time.Duration
	// BatchSize is the event source's batch size. Defaults to 100.
	BatchSize int
	// MaxRetryAttempts is the event source's retries of a failing record before it passes over
	// it (KafkaEventSource.MaxRetryAttempts); the consumer is told (StreamMaxAttempts). Defaults
	// to 0: retried until it succeeds.
	MaxRetryAttempts int
	// ProcessorEvery is the consumer's processor schedule, as in StackOptions. Defaults to 2s.
	ProcessorEvery time.Duration
	// ConsumerName is the ledger's inbox consumer name. Defaults to DefaultConsumerName.
	ConsumerName string
	// RelayEnv and ConsumerEnv add environment variables (KEY=VALUE) to each function.
	RelayEnv, ConsumerEnv []string
	// Log receives the functions' output. Defaults to discarding it.
	Log io.Writer
	// Logger receives the drivers' warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

// KafkaStack is a running local pipeline on Kafka.
type KafkaStack struct {
	// Relay and Consumer are the running functions.
	Relay, Consumer *Function
	// Schedule (the relay's), ProcessorSchedule (the consumer's processor) and Source are the
	// drivers.
	Schedule, ProcessorSchedule *Schedule
	Source                      *KafkaEventSource
	// Topic is the Kafka topic.
	Topic string

	drivers drivers
}

// StartKafkaStack starts both functions and their drivers against the brokers.
func StartKafkaStack(ctx context.Context, o KafkaStackOptions) (*KafkaStack, error) {
	if o.Topic == "" {
		o.Topic = demoapp.Topic
	}
	if o.Group == "" {
		o.Group = "sluice-ledger"
	}
	o.RelayInstances = orInt(o.RelayInstances, 2)
	o.ConsumerInstances = orInt(o.ConsumerInstances, 2)
	if o.RelayTimeout == 0 {
		o.RelayTimeout = 10 * time.Second
	}
	if o.RelayEvery == 0 {
		o.RelayEvery = 4 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	topics, _ := json.Marshal(map[string]string{demoapp.Topic: "kafka://" + o.Topic})
	// No AWS endpoint: neither function calls AWS. The region and keys only keep the SDK's
	// configuration loading from looking for an instance role.
	awsEnv := []string{"AWS_REGION=" + region(), "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}
	relayEnv := append(append(awsEnv, lambdaenv.KafkaBrokers+"="+strings.Join(o.Brokers, ",")), o.RelayEnv...)
	consumerEnv := awsEnv
	if o.MaxRetryAttempts > 0 {
		consumerEnv = append(slices.Clone(awsEnv), lambdaenv.ConsumerStreamMaxAttempts+"="+strconv.Itoa(o.MaxRetryAttempts+1))
	}
	s := &KafkaStack{Topic: o.Topic}
	var err error
	s.Relay, s.Consumer, err = startFunctions(ctx, functionsOptions{RIE: o.RIE, BinDir: o.BinDir, DatabaseURL: o.DatabaseURL,
		Topics: string(topics), RelayEnv: relayEnv, ConsumerEnv: append(consumerEnv, o.ConsumerEnv...),
		RelayTimeout: o.RelayTimeout, RelayInstances: o.RelayInstances, ConsumerInstances: o.ConsumerInstances, ConsumerName: o.ConsumerName, Log: o.Log})
	if err != nil {
		return nil, err
	}
	s.Schedule = &Schedule{Function: s.Relay, Every: o.RelayEvery, Logger: o.Logger}
	s.ProcessorSchedule = processorSchedule(s.Consumer, o.ProcessorEvery, o.Logger)
	s.Source = &KafkaEventSource{Brokers: o.Brokers, Topic: o.Topic, Group: o.Group, Function: s.Consumer, BatchSize: o.BatchSize,
		MaxRetryAttempts: o.MaxRetryAttempts, Logger: o.Logger}
	s.drivers.start(ctx, s.Schedule.Run, s.ProcessorSchedule.Run, func(ctx context.Context) {
		if err := s.Source.Run(ctx); err != nil {
			o.Logger.Error("kafka event source stopped", "error", err)
		}
	})
	return s, nil
}

// Stop stops the drivers (letting running invocations end), then the functions.
func (s *KafkaStack) Stop() { s.drivers.stop(s.Relay, s.Consumer) }
