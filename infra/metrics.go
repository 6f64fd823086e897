package infra

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/internal/emf"
)

// MetricNamespace is the CloudWatch namespace of every metric the sluice Lambdas emit as EMF.
const MetricNamespace = emf.Namespace

// Dimension names and values of the sluice metrics. Relay metrics carry exactly the dimension
// set {Service=relay}; consumer metrics carry {Service=consumer, Consumer=<consumer name>}.
const (
	// DimensionService is the dimension naming the emitting Lambda kind.
	DimensionService = emf.DimensionService
	// DimensionConsumer is the dimension naming the inbox consumer (SLUICE_CONSUMER_NAME).
	DimensionConsumer = emf.DimensionConsumer
	// ServiceRelay is the DimensionService value of relay metrics.
	ServiceRelay = emf.ServiceRelay
	// ServiceConsumer is the DimensionService value of consumer metrics.
	ServiceConsumer = emf.ServiceConsumer
)

// Relay metric names.
const (
	// MetricOutboxPending is the number of unpublished, unquarantined outbox rows (Count).
	MetricOutboxPending = emf.OutboxPending
	// MetricOutboxOldestPendingAge is the age of the oldest unpublished row (Seconds).
	MetricOutboxOldestPendingAge = emf.OutboxOldestPendingAge
	// MetricOutboxQuarantined is the number of quarantined outbox rows (Count).
	MetricOutboxQuarantined = emf.OutboxQuarantined
	// MetricRelayHeartbeat is emitted at least once a minute by every running relay (Count).
	MetricRelayHeartbeat = emf.RelayHeartbeat
	// MetricPublished counts messages the broker acknowledged (Count).
	MetricPublished = emf.Published
	// MetricPublishFailures counts failed publish attempts (Count).
	MetricPublishFailures = emf.PublishFailures
)

// Consumer metric names.
const (
	// MetricInboxProcessed counts messages applied and committed (Count).
	MetricInboxProcessed = emf.InboxProcessed
	// MetricInboxDuplicates counts messages skipped because the inbox already had them (Count).
	MetricInboxDuplicates = emf.InboxDuplicates
	// MetricInboxFailures counts records reported as failed to SQS (Count).
	MetricInboxFailures = emf.InboxFailures
	// MetricCommitToApplyLatency is the time from the outbox row's commit to the inbox commit (Milliseconds).
	MetricCommitToApplyLatency = emf.CommitToApplyLatency
)

// RelayMetric returns a relay metric (one of the Metric* relay names) with the given statistic
// ("Sum", "Maximum", "p99", ...) over one-minute periods.
func RelayMetric(name, statistic string) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(MetricNamespace),
		MetricName:    jsii.String(name),
		DimensionsMap: &map[string]*string{DimensionService: jsii.String(ServiceRelay)},
		Statistic:     jsii.String(statistic),
		Period:        awscdk.Duration_Minutes(jsii.Number(1)),
	})
}

// ConsumerMetric returns a consumer metric (one of the Metric* consumer names) of the named inbox
// consumer with the given statistic over one-minute periods.
func ConsumerMetric(consumer, name, statistic string) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:  jsii.String(MetricNamespace),
		MetricName: jsii.String(name),
		DimensionsMap: &map[string]*string{
			DimensionService:  jsii.String(ServiceConsumer),
			DimensionConsumer: jsii.String(consumer),
		},
		Statistic: jsii.String(statistic),
		Period:    awscdk.Duration_Minutes(jsii.Number(1)),
	})
}

// MetricDestinationsDown is the number of destinations a relay backs off as a whole because
// every call to them fails (Count), emitted by the relay with dimension Service=relay.
const MetricDestinationsDown = emf.DestinationsDown

// MetricOldestTransactionAge is the age of the database's oldest transaction holding a snapshot
// (Seconds), emitted by the relay: while it lasts VACUUM cannot clean up.
const MetricOldestTransactionAge = emf.OldestTransactionAge
