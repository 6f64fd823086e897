package localaws

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// The services a test may ask TestEndpointServing for. fauxqs serves SNS, SQS and S3;
// EventBridge and Kinesis need moto_server or LocalStack.
const (
	ServiceSNS         = "sns"
	ServiceSQS         = "sqs"
	ServiceS3          = "s3"
	ServiceEventBridge = "events"
	ServiceKinesis     = "kinesis"
)

// probes make one cheap read-only call per service: an endpoint serves the service when it
// answers it.
var probes = map[string]func(ctx context.Context, cfg aws.Config) error{
	ServiceSNS: func(ctx context.Context, cfg aws.Config) error {
		_, err := sns.NewFromConfig(cfg).ListTopics(ctx, &sns.ListTopicsInput{})
		return err
	},
	ServiceSQS: func(ctx context.Context, cfg aws.Config) error {
		_, err := sqs.NewFromConfig(cfg).ListQueues(ctx, &sqs.ListQueuesInput{})
		return err
	},
	ServiceS3: func(ctx context.Context, cfg aws.Config) error {
		_, err := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true }).ListBuckets(ctx, &s3.ListBucketsInput{})
		return err
	},
	ServiceEventBridge: func(ctx context.Context, cfg aws.Config) error {
		_, err := eventbridge.NewFromConfig(cfg).ListEventBuses(ctx, &eventbridge.ListEventBusesInput{})
		return err
	},
	ServiceKinesis: func(ctx context.Context, cfg aws.Config) error {
		_, err := kinesis.NewFromConfig(cfg).ListStreams(ctx, &kinesis.ListStreamsInput{})
		return err
	},
}

// Serves reports whether endpoint answers every one of services (Service* names), and names
// the first it does not.
func Serves(ctx context.Context, endpoint string, services ...string) error {
	cfg, err := Config(ctx, endpoint)
	if err != nil {
		return err
	}
	cfg.RetryMaxAttempts = 1
	for _, s := range services {
		probe, ok := probes[s]
		if !ok {
			return fmt.Errorf("localaws: unknown service %q", s)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := probe(pctx, cfg)
		cancel()
		if err != nil {
			return fmt.Errorf("%s does not serve %s: %w", endpoint, s, err)
		}
	}
	return nil
}

var (
	servingMu sync.Mutex
	// served caches, per set of services, the endpoint chosen for it (or why to skip).
	served = map[string]servedEndpoint{}
	// private is the moto_server TestEndpointServing started for services the suite's
	// emulator lacks, shared by every test of the binary.
	private *Emulator
)

type servedEndpoint struct {
	url, skip, fail string
}

// TestEndpointServing returns an endpoint that serves every one of services (Service*), for
// tests that need more than SNS and SQS (EventBridge, Kinesis):
//
//   - AWS_ENDPOINT_URL, as is, when SLUICE_AWS_EMULATOR=moto says it is moto, or when
//     SLUICE_AWS_EMULATOR is unset and the endpoint answers those services (LocalStack, or a
//     moto the user started);
//   - otherwise (fauxqs, the default emulator, serves SNS, SQS and S3 only) a private
//     moto_server, started once per test binary on first use and stopped by StopShared.
//
// Without moto_server on PATH it skips the test, saying which services it needed and why the
// suite's endpoint would not do. The endpoint's SQS is the same server's, so an EventBridge
// rule may target its queues.
func TestEndpointServing(t testing.TB, services ...string) string {
	t.Helper()
	servingMu.Lock()
	defer servingMu.Unlock()
	key := strings.Join(services, ",")
	s, ok := served[key]
	if !ok {
		s = chooseServing(services)
		served[key] = s
	}
	switch {
	case s.fail != "":
		t.Fatal(s.fail)
	case s.skip != "":
		t.Skip(s.skip)
	}
	return s.url
}

func chooseServing(services []string) servedEndpoint {
	ctx := context.Background()
	url, kind := os.Getenv(EnvEndpoint), os.Getenv(EnvEmulator)
	var why string
	switch {
	case url != "" && kind == Moto:
		return servedEndpoint{url: url}
	case url != "" && kind == "":
		// Set by the user (LocalStack, a moto of their own) or by devenv around fauxqs: ask.
		err := Serves(ctx, url, services...)
		if err == nil {
			return servedEndpoint{url: url}
		}
		why = err.Error()
	case url != "":
		why = fmt.Sprintf("%s=%s serves SNS, SQS and S3 only", EnvEmulator, kind)
	default:
		why = fmt.Sprintf("the suite's emulator (%s) serves SNS, SQS and S3 only", Chosen())
	}
	if private == nil {
		e, err := Start(ctx, Options{Kind: Moto})
		if errors.Is(err, ErrNotInstalled) {
			return servedEndpoint{skip: fmt.Sprintf("skipped: needs an endpoint serving %s; %s, and %v",
				strings.Join(services, ", "), why, err)}
		}
		if err != nil { // installed but broken: a failure, not a skip
			return servedEndpoint{fail: fmt.Sprintf("needs an endpoint serving %s; %s, and moto_server did not start: %v",
				strings.Join(services, ", "), why, err)}
		}
		private = e
	}
	return servedEndpoint{url: private.URL}
}

// TestConfigServing is Config for TestEndpointServing.
func TestConfigServing(t testing.TB, services ...string) aws.Config {
	t.Helper()
	cfg, err := Config(context.Background(), TestEndpointServing(t, services...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// stopPrivate stops the moto_server TestEndpointServing started, if any.
func stopPrivate() {
	servingMu.Lock()
	defer servingMu.Unlock()
	if private != nil {
		private.Stop()
		private = nil
	}
	served = map[string]servedEndpoint{}
}
