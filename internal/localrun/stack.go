package localrun

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// DefaultConsumerName is StackOptions.ConsumerName's default.
const DefaultConsumerName = "orders-ledger"

// StackOptions configure a Stack: the demo pipeline with the real relay binary and the demo's
// ledger consumer (examples/ledger), built by BuildLambdas.
type StackOptions struct {
	// RIE is the emulator binary and BinDir holds <fn>/bootstrap built for this machine. Required.
	RIE, BinDir string
	// DatabaseURL is the migrated database both functions use. Required.
	DatabaseURL string
	// Endpoint is the SNS/SQS endpoint (fauxqs or LocalStack). Required.
	Endpoint string
	// RelaySNSEndpoint is the endpoint the relay publishes through, e.g. a FaultProxy in front of
	// Endpoint. Defaults to Endpoint.
	RelaySNSEndpoint string
	// Name prefixes the AWS resources. Required.
	Name string
	// FIFO uses a FIFO topic and queues.
	FIFO bool
	// MaxReceiveCount and VisibilityTimeout shape the queue (see PipelineOptions).
	MaxReceiveCount   int
	VisibilityTimeout time.Duration
	// RelayInstances and ConsumerInstances are each function's concurrency. Default to 2.
	RelayInstances, ConsumerInstances int
	// RelayTimeout is the relay's function timeout and RelayEvery its schedule. Default to 10s
	// and 4s: a compressed version of AWS's 1-minute schedule, with overlapping invocations.
	RelayTimeout, RelayEvery time.Duration
	// ProcessorEvery is the consumer's processor schedule (it applies the rows stored for it,
	// such as retried dead letters). Defaults to 2s, a compressed version of the CDK's minute.
	ProcessorEvery time.Duration
	// ConsumerName is the ledger's inbox consumer name (SLUICE_CONSUMER_NAME). Defaults to
	// DefaultConsumerName.
	ConsumerName string
	// Consumer is the consumer function to run: ConsumerFunction (the ledger, the default) or
	// SkeletonFunction (lambdas/consumer, e.g. in fleet mode).
	Consumer string
	// Topics returns further logical topics and their SNS topic ARNs for the relay's
	// SLUICE_TOPIC_ARNS, beside demoapp.Topic → the pipeline's topic. It is called once the
	// pipeline exists, whose topic ARN gives the endpoint's region and account. Defaults to none.
	Topics func(Pipeline) map[string]string
	// RelayEnv and ConsumerEnv add environment variables (KEY=VALUE) to each function.
	RelayEnv, ConsumerEnv []string
	// Log receives the emulators' and the functions' output. Defaults to discarding it.
	Log io.Writer
	// Logger receives the drivers' warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

// Stack is a running local pipeline.
type Stack struct {
	// Pipeline is the topic, queue and DLQ.
	Pipeline Pipeline
	// Relay and Consumer are the running functions.
	Relay, Consumer *Function
	// Schedule (the relay's), ProcessorSchedule (the consumer's processor) and Source are the
	// drivers.
	Schedule, ProcessorSchedule *Schedule
	Source                      *EventSource
	// SNS and SQS are clients for Endpoint.
	SNS *sns.Client
	SQS *sqs.Client

	drivers drivers
}

// StartStack creates the pipeline's resources and starts both functions and their drivers.
func StartStack(ctx context.Context, o StackOptions) (*Stack, error) {
	if o.RelaySNSEndpoint == "" {
		o.RelaySNSEndpoint = o.Endpoint
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
	o.MaxReceiveCount = orInt(o.MaxReceiveCount, defaultMaxReceiveCount)
	cfg, err := localaws.Config(ctx, o.Endpoint)
	if err != nil {
		return nil, err
	}
	s := &Stack{SNS: sns.NewFromConfig(cfg), SQS: sqs.NewFromConfig(cfg)}
	s.Pipeline, err = CreatePipeline(ctx, s.SNS, s.SQS, PipelineOptions{Name: o.Name, FIFO: o.FIFO,
		MaxReceiveCount: o.MaxReceiveCount, VisibilityTimeout: o.VisibilityTimeout})
	if err != nil {
		return nil, fmt.Errorf("create the pipeline's resources: %w", err)
	}
	topicMap := map[string]string{demoapp.Topic: s.Pipeline.TopicARN}
	if o.Topics != nil {
		for k, v := range o.Topics(s.Pipeline) {
			topicMap[k] = v
		}
	}
	topics, _ := json.Marshal(topicMap)
	awsEnv := func(endpoint string) []string {
		return []string{"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=" + localaws.Region(),
			"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}
	}
	s.Relay, s.Consumer, err = startFunctions(ctx, functionsOptions{RIE: o.RIE, BinDir: o.BinDir, DatabaseURL: o.DatabaseURL,
		Topics: string(topics), RelayEnv: append(awsEnv(o.RelaySNSEndpoint), o.RelayEnv...),
		// The consumer knows the queue's last receive, as the CDK construct tells it.
		ConsumerEnv:  append(append(awsEnv(o.Endpoint), lambdaenv.ConsumerMaxReceiveCount+"="+strconv.Itoa(o.MaxReceiveCount)), o.ConsumerEnv...),
		RelayTimeout: o.RelayTimeout, RelayInstances: o.RelayInstances, ConsumerInstances: o.ConsumerInstances, ConsumerName: o.ConsumerName,
		Consumer: o.Consumer, Log: o.Log})
	if err != nil {
		return nil, err
	}
	s.Schedule = &Schedule{Function: s.Relay, Every: o.RelayEvery, Logger: o.Logger}
	s.ProcessorSchedule = processorSchedule(s.Consumer, o.ProcessorEvery, o.Logger)
	s.Source = &EventSource{SQS: s.SQS, QueueURL: s.Pipeline.QueueURL, QueueARN: s.Pipeline.QueueARN, Function: s.Consumer, Logger: o.Logger}
	s.drivers.start(ctx, s.Schedule.Run, s.ProcessorSchedule.Run, s.Source.Run)
	return s, nil
}

// processorSchedule is the consumer's processor schedule, every (default 2s).
func processorSchedule(consumer *Function, every time.Duration, log *slog.Logger) *Schedule {
	if every == 0 {
		every = 2 * time.Second
	}
	return &Schedule{Function: consumer, Every: every, Rule: "sluice-processor-schedule", Logger: log}
}

// Stop stops the drivers (letting running invocations end), then the functions.
func (s *Stack) Stop() { s.drivers.stop(s.Relay, s.Consumer) }

// drivers runs a stack's drivers (the schedule, the event source) until stop.
type drivers struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// start runs each driver in its own goroutine with a context that outlives ctx's cancellation
// (a stack stops when Stop says so).
func (d *drivers) start(ctx context.Context, run ...func(context.Context)) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	for _, r := range run {
		d.wg.Add(1)
		go func() { defer d.wg.Done(); r(runCtx) }()
	}
}

// stop stops the drivers, waits up to 15 seconds for the invocations they started to end,
// then stops the functions.
func (d *drivers) stop(fns ...*Function) {
	d.cancel()
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
	}
	for _, f := range fns {
		f.Stop()
	}
	d.wg.Wait()
}

// functionsOptions are what the relay and the ledger consumer need whatever the broker.
type functionsOptions struct {
	RIE, BinDir, DatabaseURL          string
	Topics                            string // SLUICE_TOPIC_ARNS
	RelayEnv, ConsumerEnv             []string
	RelayTimeout                      time.Duration
	RelayInstances, ConsumerInstances int
	ConsumerName                      string // defaults to DefaultConsumerName
	Consumer                          string // the consumer function; defaults to ConsumerFunction
	Log                               io.Writer
}

// startFunctions starts the relay (compressed timings: stop 2s before the timeout, 4s leases)
// and the ledger consumer under the emulator.
func startFunctions(ctx context.Context, o functionsOptions) (relay, consumer *Function, err error) {
	relayEnv := append([]string{lambdaenv.DatabaseURL + "=" + withAppName(o.DatabaseURL, "sluice-relay"), lambdaenv.TopicARNs + "=" + o.Topics,
		lambdaenv.RelayStopBefore + "=2s", "SLUICE_RELAY_LEASE=4s", "SLUICE_RELAY_PUBLISH_TIMEOUT=3s",
		"SLUICE_RELAY_BACKOFF_BASE=200ms"}, o.RelayEnv...)
	relay, err = StartFunction(ctx, FunctionOptions{Name: "sluice-relay", RIE: o.RIE, Bootstrap: filepath.Join(o.BinDir, RelayFunction, "bootstrap"),
		Env: relayEnv, Timeout: o.RelayTimeout, Instances: o.RelayInstances, Log: o.Log})
	if err != nil {
		return nil, nil, err
	}
	if o.ConsumerName == "" {
		o.ConsumerName = DefaultConsumerName
	}
	consumerEnv := append([]string{lambdaenv.DatabaseURL + "=" + withAppName(o.DatabaseURL, "sluice-consumer"),
		lambdaenv.ConsumerName + "=" + o.ConsumerName}, o.ConsumerEnv...)
	if o.Consumer == "" {
		o.Consumer = ConsumerFunction
	}
	consumer, err = StartFunction(ctx, FunctionOptions{Name: "sluice-consumer", RIE: o.RIE, Bootstrap: filepath.Join(o.BinDir, o.Consumer, "bootstrap"),
		Env: consumerEnv, Timeout: 30 * time.Second, Instances: o.ConsumerInstances, Log: o.Log})
	if err != nil {
		relay.Stop()
		return nil, nil, err
	}
	return relay, consumer, nil
}

// withAppName sets application_name on a PostgreSQL URL, so tests can find a function's sessions.
func withAppName(dbURL, name string) string {
	u, err := url.Parse(dbURL)
	if err != nil || u.Scheme == "" {
		return dbURL
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

func orInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}
