// Package infra holds the AWS CDK constructs that deploy sluice, and the example stack that wires
// them together.
//
// Each construct works on its own, so a team with an existing VPC and database can use just the
// pieces it needs:
//
//   - [NewOutbox]: the SNS topic (standard or FIFO, KMS-encrypted) and the relay Lambda that an
//     EventBridge schedule starts every minute.
//   - [NewOutboxFleet]: the same topic and destinations, and Shards relay Lambdas (each with its
//     own schedule) serving a fleet of tenant databases (pkg/fleet), whose connections are
//     checked per database server at synth.
//   - [NewConsumer]: an SQS queue with its DLQ, a raw-delivery SNS subscription with its own DLQ,
//     and the consumer Lambda behind an event source mapping with ReportBatchItemFailures; with
//     ConsumerProps.Fleet ([ConsumerFleet]) it applies into an OutboxFleet's tenant databases,
//     its connections checked on the fleet's servers beside the relays'.
//   - [NewEventBridgeDestination], [NewKinesisDestination], [NewMskDestination]: a bus, a stream
//     or a Kafka topic on MSK (an existing cluster or MSK Serverless) that OutboxProps.Destinations
//     routes logical topics to and ConsumerProps.Source subscribes a consumer to: an EventBridge
//     rule feeding the consumer's queue, or a Kinesis or MSK event source mapping with its
//     failure destination (docs/destinations.md).
//   - [NewMigrations]: a CloudFormation custom resource that applies the embedded migrations on
//     every deploy that changes them.
//   - [NewMonitoring]: the alarms (to an alarm topic) and the CloudWatch dashboard, built on the
//     metrics the Lambdas emit as EMF lines (defined in pkg/metrics).
//
// [NewSluiceStack] is the production-shaped example: VPC, RDS PostgreSQL, migrations, one outbox,
// one consumer (on SNS, EventBridge, Kinesis or MSK: SluiceStackProps.Destination), alarms and
// dashboard. infra/cmd/app is the CDK app that cdk.json runs.
//
// Asset directories are props (a directory holding a `bootstrap` executable), so tests synthesize
// templates without building the Lambdas. Bad props panic with a message naming the construct and
// every problem found, which fails `cdk synth`.
package infra
