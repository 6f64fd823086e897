package lambdaenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-msk-iam-sasl-signer-go/signer"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// The relay's destinations beyond SNS, and its claim check. The destinations themselves are
// SLUICE_TOPIC_ARNS' values (outbox.ParseDestination): SNS topic, EventBridge bus and Kinesis
// stream ARNs, and kafka://TOPIC.
const (
	// EventBridgeSource is the Source of events put on EventBridge buses. Defaults to
	// outbox.DefaultEventSource ("sluice").
	EventBridgeSource = "SLUICE_EVENTBRIDGE_SOURCE"
	// KafkaBrokers lists the Kafka bootstrap brokers, comma-separated (host:port). Required
	// when a destination is kafka://...
	KafkaBrokers = "SLUICE_KAFKA_BROKERS"
	// KafkaAuth is how the relay authenticates to Kafka: "none" (the default) or "iam" (Amazon
	// MSK IAM access control: SASL/OAUTHBEARER with a token signed by the function's AWS
	// credentials, over TLS).
	KafkaAuth = "SLUICE_KAFKA_AUTH"
	// KafkaTLS is "true" or "false": connect to the brokers over TLS (system roots). Defaults to
	// true with KafkaAuth=iam (MSK requires it), false otherwise.
	KafkaTLS = "SLUICE_KAFKA_TLS"
	// ClaimCheckBucket turns the claim check on: payloads of messages too large for their
	// destination are stored in this S3 bucket (outbox.ClaimCheck).
	ClaimCheckBucket = "SLUICE_CLAIM_CHECK_BUCKET"
	// ClaimCheckPrefix is put before each object's key (the event id). Defaults to "". The
	// consumers fetch only objects under it.
	ClaimCheckPrefix = "SLUICE_CLAIM_CHECK_PREFIX"
	// ClaimCheckBucketOwner is the account id that owns ClaimCheckBucket: the consumers send it
	// as ExpectedBucketOwner with every GetObject. Defaults to "": not checked (the CDK sets it
	// to the stack's account).
	ClaimCheckBucketOwner = "SLUICE_CLAIM_CHECK_BUCKET_OWNER"
	// ClaimCheckThreshold is outbox.RelaySetting("ClaimCheck.Threshold").Env, named here for
	// `sluice status` (a test keeps the two equal).
	ClaimCheckThreshold = "SLUICE_CLAIM_CHECK_THRESHOLD"
	// ClaimCheckMaxPayload is outbox.RelaySetting("ClaimCheck.MaxPayloadBytes").Env, which the
	// consumers read too, with the inbox's bounds (a test keeps the two equal).
	ClaimCheckMaxPayload = "SLUICE_CLAIM_CHECK_MAX_PAYLOAD"
)

// RelayPublisher builds the publisher for destinations (outbox.RelayConfig.Destinations): an
// SNS publisher when they are all SNS topics, otherwise outbox.Publishers with a publisher for
// each kind they name (EventBridge, Kinesis, and Kafka with a client from KafkaBrokers and
// friends). close releases what it
// opened (the Kafka client). Every problem is reported at once, naming its variable.
func RelayPublisher(ctx context.Context, getenv Getenv, awsCfg aws.Config, destinations []string) (pub outbox.Publisher, close func(), err error) {
	kinds := map[outbox.Kind]bool{}
	var errs []error
	for _, d := range destinations {
		dest, err := outbox.ParseDestination(d)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", TopicARNs, err))
			continue
		}
		kinds[dest.Kind] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	close = func() {}
	pubs := outbox.Publishers{}
	if kinds[outbox.SNS] || len(kinds) == 0 {
		pubs.SNS = outbox.NewSNSPublisher(sns.NewFromConfig(awsCfg))
	}
	if kinds[outbox.EventBridge] {
		pubs.EventBridge = outbox.NewEventBridgePublisher(eventbridge.NewFromConfig(awsCfg), getenv(EventBridgeSource))
	}
	if kinds[outbox.Kinesis] {
		pubs.Kinesis = outbox.NewKinesisPublisher(kinesis.NewFromConfig(awsCfg))
	}
	if kinds[outbox.Kafka] {
		client, maxBytes, err := relayKafkaClient(ctx, getenv, awsCfg)
		if err != nil {
			return nil, nil, err
		}
		close = client.Close
		pubs.Kafka = outbox.NewKafkaPublisher(client, maxBytes)
	}
	if len(kinds) <= 1 && kinds[outbox.SNS] || len(kinds) == 0 {
		return pubs.SNS, close, nil
	}
	return pubs, close, nil
}

// relayKafkaClient opens the relay's Kafka client with its record batch limit: what the relay
// plans with (MessageLimits.Kafka, SLUICE_KAFKA_MAX_MESSAGE_BYTES) is what franz-go lets a batch be
// (ProducerBatchMaxBytes), or a record the relay sends would fail MESSAGE_TOO_LARGE in the
// client at franz-go's default of 1,000,012 bytes.
func relayKafkaClient(ctx context.Context, getenv Getenv, awsCfg aws.Config) (*kgo.Client, int, error) {
	settings, err := RelaySettings(getenv)
	if err != nil {
		return nil, 0, err
	}
	maxBytes := settings.MessageLimits.WithDefaults().Kafka
	client, err := KafkaClient(ctx, getenv, awsCfg, kgo.ProducerBatchMaxBytes(int32(maxBytes)))
	return client, maxBytes, err
}

// KafkaClient opens a franz-go client from KafkaBrokers, KafkaAuth and KafkaTLS, with
// franz-go's idempotent producer and acks from every in-sync replica, plus opts (a consumer
// adds its group and topics).
func KafkaClient(ctx context.Context, getenv Getenv, awsCfg aws.Config, opts ...kgo.Opt) (*kgo.Client, error) {
	var brokers []string
	for _, b := range strings.Split(getenv(KafkaBrokers), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return nil, fmt.Errorf("%s is required for Kafka (host:port, comma-separated)", KafkaBrokers)
	}
	auth := strings.ToLower(strings.TrimSpace(getenv(KafkaAuth)))
	useTLS := auth == "iam"
	if raw := strings.TrimSpace(getenv(KafkaTLS)); raw != "" {
		v, err := strconv.ParseBool(raw)
		if err != nil {
			return nil, fmt.Errorf("%s must be true or false, got %q", KafkaTLS, raw)
		}
		useTLS = v
	}
	all := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks())}
	if useTLS {
		all = append(all, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	switch auth {
	case "", "none":
	case "iam":
		region, creds := awsCfg.Region, awsCfg.Credentials
		if region == "" || creds == nil {
			return nil, fmt.Errorf("%s=iam needs the AWS region and credentials of the function", KafkaAuth)
		}
		all = append(all, kgo.SASL(oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
			token, _, err := signer.GenerateAuthTokenFromCredentialsProvider(ctx, region, creds)
			return oauth.Auth{Token: token}, err
		})))
	default:
		return nil, fmt.Errorf("%s must be none or iam, got %q", KafkaAuth, auth)
	}
	client, err := kgo.NewClient(append(all, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return client, nil
}

// ClaimCheck reads the claim check's settings: nil when ClaimCheckBucket is unset; with it,
// ClaimCheckPrefix and the variables of outbox.RelaySettings' ClaimCheck.* entries. The
// payloads go to S3 through a client built from awsCfg. Every problem is reported at once,
// each naming its variable.
func ClaimCheck(getenv Getenv, awsCfg aws.Config) (*outbox.ClaimCheck, error) {
	loc := claimCheckLocation(getenv)
	if loc.Bucket == "" {
		return nil, nil
	}
	cfg := outbox.RelayConfig{ClaimCheck: &outbox.ClaimCheck{
		Store:  outbox.NewS3PayloadStore(s3.NewFromConfig(awsCfg, func(o *s3.Options) { o.UsePathStyle = pathStyle(awsCfg) })),
		Bucket: loc.Bucket, KeyPrefix: loc.KeyPrefix,
	}}
	errs := readSettings(getenv, &cfg, func(s outbox.Setting) bool { return strings.HasPrefix(s.Field, "ClaimCheck.") })
	if len(errs) == 0 {
		errs = nameVariables(cfg.ClaimCheck.Check())
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("claim check: %w", err)
	}
	return cfg.ClaimCheck, nil
}

// pathStyle reports whether S3 must be addressed by path (a local endpoint, which has no
// per-bucket host names).
func pathStyle(cfg aws.Config) bool { return cfg.BaseEndpoint != nil && *cfg.BaseEndpoint != "" }

// positiveInt reads an integer variable that must be positive; def when unset.
func positiveInt(getenv Getenv, name string, def int) (int, error) {
	raw := strings.TrimSpace(getenv(name))
	if raw == "" {
		return def, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s must be a positive integer, got %q", name, raw)
	}
	return n, nil
}
