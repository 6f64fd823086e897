package infra

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsrds"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/customresources"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	sluiceoutbox "github.com/sluicehq/sluice/pkg/outbox"
)

// VisibilityTimeoutFactor is the minimum ratio of the queue's visibility timeout to the consumer
// function's timeout, as AWS recommends for SQS event sources: a message must not become visible
// again while a (retried) invocation may still be processing it.
const VisibilityTimeoutFactor = 6

// Commit modes of the consumer (SLUICE_CONSUMER_COMMIT_MODE).
const (
	// CommitPerRecord commits one transaction per SQS record (the default).
	CommitPerRecord = "per-record"
	// CommitBatched commits a batch's records together, falling back per record on failure.
	CommitBatched = "batched"
	// CommitAsync stores each message in inbox_event and acknowledges it; the same function,
	// invoked every minute by the schedule the construct adds to every consumer, is the inbox
	// Processor that applies the stored rows with the same handlers (retrying, parking a row
	// after its attempts), running until shortly before its deadline.
	CommitAsync = "async"
)

// ConsumerProps configure a Consumer.
type ConsumerProps struct {
	// Name is the inbox consumer name (SLUICE_CONSUMER_NAME): the first half of the inbox key and
	// the Consumer dimension of its metrics. Must be stable: renaming it re-applies every message
	// still in flight. Required.
	Name string
	// CodeDir is a directory holding the consumer's `bootstrap` (bin/consumer after `make build`). Required.
	CodeDir string
	// Topic is the topic to subscribe to, e.g. Outbox.Topic(). Required unless Source.
	Topic awssns.ITopic
	// Source subscribes the consumer to a Destination instead of Topic (exactly one of the two):
	// an EventBridge bus, whose rule sends the relay's events to the consumer's queue, so the
	// SQS path, its DLQs and `sluice redrive` work as with SNS; or a Kinesis stream or MSK
	// topic, read by an event source mapping on the stream or topic itself (no queue; see
	// Stream). Defaults to none.
	Source Destination
	// DetailTypes narrows an EventBridge Source's rule to these event types (detail-type).
	// Defaults to every event of the relay's Source.
	DetailTypes []string
	// Stream tunes a Kinesis or MSK Source's event source mapping. Defaults: see
	// StreamSourceSettings.
	Stream StreamSourceSettings
	// Fifo makes the queues FIFO queues; required when Topic is a FIFO topic and forbidden when it
	// is a standard topic. Defaults to standard queues.
	Fifo bool
	// FilterPolicy optionally filters the subscription on message attributes (e.g. eventType).
	FilterPolicy map[string]awssns.SubscriptionFilter
	// Network places the consumer in the database's VPC. Network.Vpc is required.
	Network Network
	// Database is how the consumer reaches PostgreSQL. Database.Secret is required, unless
	// Fleet.
	Database Database
	// Fleet makes this a fleet consumer: it applies each message in the database of the
	// tenant the fleet's relay named (the sluiceTenant header), one of an OutboxFleet's
	// tenants, instead of in Database's (see ConsumerFleet). Database, Migrations,
	// UseDatabaseSecret, DatabaseRole, DatabaseRoleName, DatabaseGrants and Proxy must then be
	// unset. Defaults to none: the consumer applies into Database.
	Fleet *ConsumerFleet
	// Migrations, when set, gives the consumer its own database role (read, insert, update and delete
	// its own inbox_event rows, plus DatabaseGrants) with its own rotated secret, so handler code
	// never runs as Database.Secret's user; the consumer is created after the migrations ran,
	// and its connections are booked against the migrations' connection budget. Required unless
	// UseDatabaseSecret.
	Migrations Migrations
	// UseDatabaseSecret makes the consumer, and so its handler code, log in with
	// Database.Secret itself (typically the owner or the master user) instead of a role of its
	// own. It is the explicit choice for a stack without Migrations: synthesis fails when
	// neither is set, and warns when this is. Defaults to false.
	UseDatabaseSecret bool
	// DatabaseRoleName is the consumer's role name with Migrations. Defaults to
	// "sluice_consumer_<Name>" (lower case, other characters as "_").
	DatabaseRoleName string
	// DatabaseGrants are the privileges the service's handlers need beyond the inbox, e.g.
	// {Table: "invoice", Privileges: ["SELECT", "INSERT"]}. Needs Migrations.
	DatabaseGrants []DatabaseGrant
	// DatabaseRole is a role made beforehand with NewDatabaseRole (Kind RoleConsumer), e.g. to
	// hand its secret to an RDS Proxy; then DatabaseRoleName and DatabaseGrants stay empty.
	DatabaseRole DatabaseRole
	// Proxy, when set, is an RDS Proxy (with RequireTLS) the consumer connects through, whose
	// secrets include the consumer's (DatabaseRole's). pgx then runs in exec mode (no named
	// prepared statements, which would pin each client connection to a database connection),
	// and the consumer's connections are the proxy's: the connection budget books the proxy's
	// share of max_connections (ProxyMaxConnectionsPercent, once per proxy) instead of the
	// consumer's. Defaults to a direct connection.
	Proxy awsrds.DatabaseProxy
	// ProxyMaxConnectionsPercent is Proxy's MaxConnectionsPercent (the share of max_connections
	// its target group may open), booked against the migrations' connection budget. Defaults
	// to 100, RDS Proxy's own default; set it to the proxy's value.
	ProxyMaxConnectionsPercent int
	// CommitMode is CommitPerRecord, CommitBatched or CommitAsync (SLUICE_CONSUMER_COMMIT_MODE).
	// In every mode the construct schedules the function every minute to run the inbox
	// Processor (ProcessorSchedule) and books those invocations' connections, and the
	// monitoring alarms on parked rows: `sluice dead retry` stores a dead letter as an async
	// row, which the processor applies. With CommitAsync each scheduled invocation runs until
	// shortly before its deadline; in the other modes it applies what is ready and returns.
	// Defaults to the consumer's default (per-record).
	CommitMode string
	// DeadlineMargin: a record is not started when the invocation's deadline is nearer; it comes
	// back from SQS instead (SLUICE_CONSUMER_DEADLINE_MARGIN). Negative disables the check.
	// Defaults to the consumer's default, 3 seconds (lambdaenv.DefaultConsumerDeadlineMargin).
	DeadlineMargin time.Duration
	// StorePayload keeps each message's payload and headers in inbox_event for audit or replay
	// (SLUICE_CONSUMER_STORE_PAYLOAD). Defaults to false.
	StorePayload bool
	// Environment adds environment variables to the consumer Lambda (e.g. your handler's settings).
	Environment map[string]string
	// HTTPSToAnywhere lets the consumer's handler code call HTTPS services anywhere (through the
	// VPC's NAT gateways): its security group then also allows 443 to any address, not only to
	// Network.ApiEndpoints. The example stack sets it when it has NAT gateways. Defaults to
	// false.
	HTTPSToAnywhere bool
	// Redrivers are IAM principal ARNs (roles) allowed to send messages to the queue directly,
	// e.g. the operator role that runs `sluice redrive` (or starts an SQS message move task)
	// from the DLQs. The queue policy denies sqs:SendMessage to every other principal but the
	// topic's deliveries, so that nobody can forge a message the consumer would apply. Defaults
	// to none.
	Redrivers []string

	// Timeout is the consumer Lambda's timeout. Defaults to 30 seconds.
	Timeout time.Duration
	// MemoryMB is the consumer Lambda's memory. Defaults to 256, or with ClaimCheck to what a
	// batch of its largest payloads needs (ConsumerMemoryMB: BatchSize × MaxPayloadBytes × 2
	// + 128 MB), which a smaller value set here may not undercut.
	MemoryMB int
	// VisibilityTimeout is the queue's visibility timeout; at least VisibilityTimeoutFactor ×
	// Timeout. Defaults to VisibilityTimeoutFactor × Timeout + MaxBatchingWindow.
	VisibilityTimeout time.Duration
	// MaxReceiveCount is how many receives a message gets before it moves to the DLQ; the
	// consumer marks a message's dead letter dead when its last receive fails
	// (SLUICE_CONSUMER_MAX_RECEIVE_COUNT). Defaults to 5.
	MaxReceiveCount int
	// BatchSize is the event source mapping's batch size: 1..10 (FIFO) or 1..10000 (standard;
	// above 10 needs a batching window). Defaults to 10.
	BatchSize int
	// MaxBatchingWindow is how long the event source waits to fill a batch, up to 5 minutes; not
	// supported on FIFO queues. Defaults to 0 (invoke as soon as messages arrive).
	MaxBatchingWindow time.Duration
	// MaxConcurrency caps concurrent consumer invocations for this queue (2..1000), protecting the
	// database: at most MaxConcurrency × Database.MaxConns connections (the SQS mapping's
	// maximum concurrency; with a Kinesis or MSK Source, the function's reserved concurrency).
	// Defaults to 5.
	MaxConcurrency int
	// RetentionPeriod is how long the queue keeps messages. Defaults to 4 days.
	RetentionPeriod time.Duration
	// DeadLetterRetentionPeriod is how long both DLQs keep messages. Defaults to 14 days (the maximum).
	DeadLetterRetentionPeriod time.Duration
	// QueueKey encrypts the queue and both DLQs. Defaults to a new customer-managed key with
	// rotation whose policy lets SNS use it for this topic only (aws:SourceArn). A key you pass
	// gets that statement when it is defined in the app; an imported key's policy must allow
	// sns.amazonaws.com kms:GenerateDataKey* and kms:Decrypt with that condition itself.
	QueueKey awskms.IKey
	// LogRetention is the consumer log group's retention. Defaults to one month.
	LogRetention awslogs.RetentionDays
	// ClaimCheck is the bucket (NewClaimCheck) the relay stores large payloads in: the consumer
	// fetches them before its handlers run (SLUICE_CLAIM_CHECK_BUCKET, GetObject, HTTPS to any
	// address for the S3 gateway endpoint). Synthesis fails when RetentionPeriod plus
	// DeadLetterRetentionPeriod outlive its objects. Defaults to none: a message whose payload
	// is in S3 fails and reaches the DLQ.
	ClaimCheck ClaimCheck
}

// ConsumerFleet makes a Consumer apply into the tenant databases of an OutboxFleet
// (lambdas/consumer's fleet mode, docs/inbox.md "Fleet: one consumer, many tenant databases").
// The consumer reaches the tenants as the fleet's relays do, from the same settings: every
// static tenant (SLUICE_FLEET_TENANTS, all of them, not a shard's) and the control table
// (SLUICE_FLEET_REGISTRY_SECRET_ARN), read access to the same secrets (each tenant's by its
// ARN, the control table's tenants' under FleetRegistry.TenantSecretsPrefix), the fleet's TLS
// settings, and ingress on the servers whose FleetServer.Connections is set. Its connections
// are booked on the servers' budgets beside the relays' (see MaxConns).
type ConsumerFleet struct {
	// Fleet is the OutboxFleet (NewOutboxFleet) whose tenant databases the consumer applies
	// into; the consumer usually subscribes to its topic. Required.
	Fleet OutboxFleet
	// TenantMaxConns is the most connections one consumer instance holds on one tenant's
	// database (SLUICE_CONSUMER_TENANT_MAX_CONNS), 1 to 100 and at most MaxConns. Defaults to
	// lambdaenv.DefaultConsumerTenantMaxConns (2).
	TenantMaxConns int
	// MaxConns is the most connections one consumer instance holds on all tenant databases
	// together (SLUICE_CONSUMER_FLEET_MAX_CONNS), 1 to 10000. At synth each server of the fleet
	// books the consumer's instances (MaxConcurrency, plus the processor schedule's overlapping
	// invocations) × what one instance may hold there: MaxConns, or with static tenants only,
	// the server's tenants × TenantMaxConns when that is less; and with the control table one
	// connection per instance on the control database's server. Defaults to
	// lambdaenv.DefaultConsumerFleetMaxConns (10).
	MaxConns int
}

// Consumer is an SQS queue subscribed to a topic (or fed by an EventBridge rule), with DLQs, and
// the consumer Lambda reading it; or the consumer Lambda reading a Kinesis stream or an MSK
// topic, with a DLQ for the failure records.
type Consumer interface {
	constructs.IConstruct
	// Name is the inbox consumer name.
	Name() string
	// Queue is the queue the consumer reads.
	Queue() awssqs.IQueue
	// DeadLetterQueue receives messages that failed MaxReceiveCount times.
	DeadLetterQueue() awssqs.IQueue
	// SubscriptionDeadLetterQueue receives messages SNS could not deliver to Queue.
	SubscriptionDeadLetterQueue() awssqs.IQueue
	// Subscription is the SNS subscription of Queue.
	Subscription() awssns.Subscription
	// Function is the consumer Lambda.
	Function() awslambda.IFunction
	// QueueKey is the KMS key encrypting the queues.
	QueueKey() awskms.IKey
	// Source is the destination the consumer reads (ConsumerProps.Source), nil for an SNS
	// topic. With a Kinesis or MSK source, Queue, SubscriptionDeadLetterQueue and
	// Subscription are nil and DeadLetterQueue receives the failure records.
	Source() Destination
	// Rule is the EventBridge rule sending a bus's events to Queue; nil without an EventBridge
	// source.
	Rule() awsevents.CfnRule
	// ProcessorSchedule is the rule invoking Function every minute to apply the consumer's
	// stored rows: an async consumer's messages (CommitAsync) and, in every commit mode, the
	// dead letters `sluice dead retry` stored.
	ProcessorSchedule() awsevents.Rule
}

type consumer struct {
	constructs.Construct
	name     string
	queue    awssqs.Queue
	dlq      awssqs.Queue
	subDLQ   awssqs.Queue
	ruleArn  *string // the EventBridge rule's, formatted (subscribeBus)
	sub      awssns.Subscription
	fn       awslambda.Function
	queueKey awskms.IKey
	source   Destination
	rule     awsevents.CfnRule
	process  awsevents.Rule
}

func (c *consumer) Name() string                               { return c.name }
func (c *consumer) Queue() awssqs.IQueue                       { return c.queue }
func (c *consumer) DeadLetterQueue() awssqs.IQueue             { return c.dlq }
func (c *consumer) SubscriptionDeadLetterQueue() awssqs.IQueue { return c.subDLQ }
func (c *consumer) Subscription() awssns.Subscription          { return c.sub }
func (c *consumer) Function() awslambda.IFunction              { return c.fn }
func (c *consumer) QueueKey() awskms.IKey                      { return c.queueKey }
func (c *consumer) Source() Destination                        { return c.source }
func (c *consumer) Rule() awsevents.CfnRule                    { return c.rule }
func (c *consumer) ProcessorSchedule() awsevents.Rule          { return c.process }

// maxLambdaMemoryMB is the most memory a Lambda function may have.
const maxLambdaMemoryMB = 10_240

func (p *ConsumerProps) withDefaults() ConsumerProps {
	out := *p
	out.Timeout = orDefault(out.Timeout, 30*time.Second)
	memorySet := out.MemoryMB != 0
	out.MemoryMB = orDefault(out.MemoryMB, 256)
	out.VisibilityTimeout = orDefault(out.VisibilityTimeout, VisibilityTimeoutFactor*out.Timeout+out.MaxBatchingWindow)
	out.MaxReceiveCount = orDefault(out.MaxReceiveCount, 5)
	out.BatchSize = orDefault(out.BatchSize, 10)
	if !memorySet && out.ClaimCheck != nil {
		out.MemoryMB = max(256, ConsumerMemoryMB(out.BatchSize, out.ClaimCheck.maxPayload()))
	}
	out.MaxConcurrency = orDefault(out.MaxConcurrency, 5)
	out.RetentionPeriod = orDefault(out.RetentionPeriod, 4*24*time.Hour)
	out.DeadLetterRetentionPeriod = orDefault(out.DeadLetterRetentionPeriod, 14*24*time.Hour)
	out.LogRetention = orDefault(out.LogRetention, awslogs.RetentionDays_ONE_MONTH)
	out.ProxyMaxConnectionsPercent = orDefault(out.ProxyMaxConnectionsPercent, 100)
	if p.Fleet != nil {
		f := *p.Fleet
		f.TenantMaxConns = orDefault(f.TenantMaxConns, lambdaenv.DefaultConsumerTenantMaxConns)
		f.MaxConns = orDefault(f.MaxConns, lambdaenv.DefaultConsumerFleetMaxConns)
		out.Fleet = &f
	}
	return out
}

func (p *ConsumerProps) validate() error {
	errs := []error{checkAssetDir("CodeDir", p.CodeDir), p.Network.validate()}
	if p.Fleet != nil {
		errs = append(errs, p.validateFleet()...)
	} else {
		errs = append(errs, p.Database.validate())
	}
	if p.Name == "" {
		errs = append(errs, errors.New("Name is required (the inbox consumer name)"))
	}
	if p.Source != nil || p.Topic == nil {
		errs = append(errs, p.validateSource()...)
	} else if topicFifo := p.Topic.Fifo(); topicFifo != nil {
		switch {
		case p.Fifo && !*topicFifo:
			errs = append(errs, errors.New("a FIFO consumer cannot subscribe to a standard topic: set Fifo false or use a FIFO topic"))
		case !p.Fifo && *topicFifo:
			errs = append(errs, errors.New("a FIFO topic can only deliver to FIFO queues: set Fifo true"))
		}
	}
	if p.Timeout < time.Second || p.Timeout > 15*time.Minute {
		errs = append(errs, fmt.Errorf("Timeout must be between 1s and 15m, got %s", p.Timeout))
	}
	if min := VisibilityTimeoutFactor * p.Timeout; p.VisibilityTimeout < min {
		errs = append(errs, fmt.Errorf("VisibilityTimeout %s is shorter than %d × the function timeout (%s) = %s; messages would be redelivered while still in process",
			p.VisibilityTimeout, VisibilityTimeoutFactor, p.Timeout, min))
	}
	if p.VisibilityTimeout > 12*time.Hour {
		errs = append(errs, fmt.Errorf("VisibilityTimeout must be at most 12h, got %s", p.VisibilityTimeout))
	}
	if p.MaxReceiveCount < 1 {
		errs = append(errs, fmt.Errorf("MaxReceiveCount must be at least 1, got %d", p.MaxReceiveCount))
	}
	maxBatch := 10000
	if p.Fifo {
		maxBatch = 10
	}
	if p.BatchSize < 1 || p.BatchSize > maxBatch {
		errs = append(errs, fmt.Errorf("BatchSize must be between 1 and %d, got %d", maxBatch, p.BatchSize))
	}
	if p.BatchSize > 10 && p.MaxBatchingWindow < time.Second && !p.streamSource() {
		errs = append(errs, fmt.Errorf("BatchSize %d above 10 needs a MaxBatchingWindow of at least 1s", p.BatchSize))
	}
	if p.MaxBatchingWindow < 0 || p.MaxBatchingWindow > 5*time.Minute {
		errs = append(errs, fmt.Errorf("MaxBatchingWindow must be between 0 and 5m, got %s", p.MaxBatchingWindow))
	}
	if p.Fifo && p.MaxBatchingWindow > 0 {
		errs = append(errs, errors.New("MaxBatchingWindow is not supported on FIFO queues"))
	}
	if p.MaxConcurrency < 2 || p.MaxConcurrency > 1000 {
		errs = append(errs, fmt.Errorf("MaxConcurrency must be between 2 and 1000, got %d", p.MaxConcurrency))
	}
	if p.MemoryMB < 128 {
		errs = append(errs, fmt.Errorf("MemoryMB must be at least 128, got %d", p.MemoryMB))
	}
	if p.CommitMode != "" && p.CommitMode != CommitPerRecord && p.CommitMode != CommitBatched && p.CommitMode != CommitAsync {
		errs = append(errs, fmt.Errorf("CommitMode must be %q, %q or %q, got %q", CommitPerRecord, CommitBatched, CommitAsync, p.CommitMode))
	}
	if p.DeadlineMargin >= p.Timeout {
		errs = append(errs, fmt.Errorf("DeadlineMargin %s must be shorter than Timeout %s: no record would ever start", p.DeadlineMargin, p.Timeout))
	}
	if errors.Join(errs...) == nil {
		// What the props checks above cannot see, the Lambda's own reader can.
		if _, err := consumerEnvironment(p); err != nil {
			errs = append(errs, err)
		}
	}
	if p.Fleet == nil {
		errs = append(errs, p.validateLogin()...)
	}
	for i, a := range p.Redrivers {
		if !strings.HasPrefix(a, "arn:") {
			errs = append(errs, fmt.Errorf("Redrivers[%d] %q is not an ARN", i, a))
		}
	}
	if p.ClaimCheck != nil {
		errs = append(errs, p.ClaimCheck.checkConsumer(p.Name, p.RetentionPeriod, p.DeadLetterRetentionPeriod))
		// A batch's fetched payloads are in memory together: refuse what cannot fit.
		if need := ConsumerMemoryMB(p.BatchSize, p.ClaimCheck.maxPayload()); p.MemoryMB < need || need > maxLambdaMemoryMB {
			errs = append(errs, fmt.Errorf("MemoryMB %d cannot hold a batch of %d claim-checked payloads of up to %d bytes: it needs %d MB "+
				"(BatchSize × MaxPayloadBytes × 2 + 128 MB; Lambda allows up to %d): lower BatchSize or the claim check's MaxPayloadBytes, or raise MemoryMB",
				p.MemoryMB, p.BatchSize, p.ClaimCheck.maxPayload(), need, maxLambdaMemoryMB))
		}
	}
	for _, r := range []struct {
		name string
		d    time.Duration
	}{{"RetentionPeriod", p.RetentionPeriod}, {"DeadLetterRetentionPeriod", p.DeadLetterRetentionPeriod}} {
		if r.d < time.Minute || r.d > 14*24*time.Hour {
			errs = append(errs, fmt.Errorf("%s must be between 1m and 14 days, got %s", r.name, r.d))
		}
	}
	return errors.Join(errs...)
}

// validateLogin checks how a consumer on one database (no Fleet) logs in: its role, or
// Database.Secret, directly or through an RDS Proxy.
func (p *ConsumerProps) validateLogin() []error {
	var errs []error
	if p.Migrations == nil && (p.DatabaseRole != nil || len(p.DatabaseGrants) > 0 || p.DatabaseRoleName != "") {
		errs = append(errs, errors.New("DatabaseRole, DatabaseRoleName and DatabaseGrants need Migrations (it creates the roles)"))
	}
	if p.DatabaseRole != nil && (len(p.DatabaseGrants) > 0 || p.DatabaseRoleName != "") {
		errs = append(errs, errors.New("with DatabaseRole, its grants and name belong to the role: leave DatabaseRoleName and DatabaseGrants empty"))
	}
	switch {
	case p.Migrations == nil && !p.UseDatabaseSecret:
		errs = append(errs, errors.New("Migrations is not set, so the consumer's handler code would log in with Database.Secret (the owner's or master credentials): "+
			"set Migrations to give the consumer a role of its own (recommended), or UseDatabaseSecret to log in with Database.Secret knowingly"))
	case p.Migrations != nil && p.UseDatabaseSecret:
		errs = append(errs, errors.New("UseDatabaseSecret and Migrations exclude each other: with Migrations the consumer logs in with its own role"))
	case p.Migrations != nil:
		if m, ok := p.Migrations.(*migrations); ok {
			if err := m.checkInboxRetention(p.Name, p.RetentionPeriod, p.DeadLetterRetentionPeriod); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if p.ProxyMaxConnectionsPercent < 0 || p.ProxyMaxConnectionsPercent > 100 {
		errs = append(errs, fmt.Errorf("ProxyMaxConnectionsPercent must be between 1 and 100, got %d", p.ProxyMaxConnectionsPercent))
	}
	if p.Proxy != nil && p.Migrations == nil {
		errs = append(errs, errors.New("Proxy needs the consumer's own role (Migrations and DatabaseRole): the proxy authenticates it with that role's secret"))
	}
	if p.Proxy != nil && p.DatabaseRole == nil {
		errs = append(errs, errors.New("Proxy needs DatabaseRole: make it with NewDatabaseRole and give its secret to the proxy"))
	}
	for i, g := range p.DatabaseGrants {
		if err := g.validate(); err != nil {
			errs = append(errs, fmt.Errorf("DatabaseGrants[%d]: %w", i, err))
		}
	}
	return errs
}

// validateFleet checks the props of a fleet consumer: a fleet made by NewOutboxFleet, pool
// bounds of at least 1 (the Lambda's own reader checks the rest, consumerEnvironment), and
// none of the settings of a consumer on one database.
func (p *ConsumerProps) validateFleet() []error {
	f := p.Fleet
	var errs []error
	if f.Fleet == nil {
		errs = append(errs, errors.New("Fleet.Fleet is required: the OutboxFleet whose tenant databases the consumer applies into"))
	} else if _, ok := f.Fleet.(*outboxFleet); !ok {
		errs = append(errs, errors.New("Fleet.Fleet must be made by NewOutboxFleet"))
	}
	for _, c := range []struct {
		field, env string
		n          int
	}{{"Fleet.TenantMaxConns", lambdaenv.ConsumerTenantMaxConns, f.TenantMaxConns}, {"Fleet.MaxConns", lambdaenv.ConsumerFleetMaxConns, f.MaxConns}} {
		if c.n < 1 {
			errs = append(errs, fmt.Errorf("%s (%s) must be at least 1, got %d", c.field, c.env, c.n))
		}
	}
	for _, u := range []struct {
		field string
		set   bool
	}{
		{"Database.Secret", p.Database.Secret != nil}, {"Database.Connections", p.Database.Connections != nil},
		{"Database.MaxConns", p.Database.MaxConns != 0}, {"Database.SSLMode", p.Database.SSLMode != ""},
		{"Database.CABundle", p.Database.CABundle != ""}, {"Migrations", p.Migrations != nil},
		{"UseDatabaseSecret", p.UseDatabaseSecret}, {"DatabaseRole", p.DatabaseRole != nil},
		{"DatabaseRoleName", p.DatabaseRoleName != ""}, {"DatabaseGrants", len(p.DatabaseGrants) > 0}, {"Proxy", p.Proxy != nil},
	} {
		if u.set {
			errs = append(errs, fmt.Errorf("%s must be unset with Fleet: a fleet consumer logs in to each tenant's database with the tenant's secret "+
				"and the fleet's TLS settings (OutboxFleetProps.Database), as the fleet's relays do", u.field))
		}
	}
	return errs
}

func seconds(d time.Duration) awscdk.Duration {
	return awscdk.Duration_Seconds(jsii.Number(d.Seconds()))
}

// NewConsumer creates the queues, the subscription and the consumer Lambda, and books the
// function's database connections: on the migrations' budget, or with Fleet on the budgets of
// the fleet's servers (ConsumerFleet.MaxConns says how). It panics on invalid props, naming
// every problem, and when a budget is exceeded, showing the arithmetic.
func NewConsumer(scope constructs.Construct, id string, props *ConsumerProps) Consumer {
	p := props.withDefaults()
	invalid("Consumer", id, p.validate())

	c := &consumer{name: p.Name, source: p.Source}
	constructs.NewConstruct_Override(c, scope, &id) // c itself is the jsii construct, so it can be passed to CDK APIs
	this := c

	c.queueKey = p.QueueKey
	if c.queueKey == nil {
		// SqsSubscription adds the statement letting SNS encrypt what it delivers with this key.
		c.queueKey = newKey(this, "QueueKey", "sluice consumer "+p.Name+" queue encryption")
	}
	queueProps := func(retention time.Duration) *awssqs.QueueProps {
		q := &awssqs.QueueProps{
			Encryption:          awssqs.QueueEncryption_KMS,
			EncryptionMasterKey: c.queueKey,
			EnforceSSL:          jsii.Bool(true),
			RetentionPeriod:     seconds(retention),
		}
		if p.Fifo {
			q.Fifo = jsii.Bool(true)
		}
		// Messages outlive the stack: a deleted stack must not take undelivered ones with it.
		q.RemovalPolicy = awscdk.RemovalPolicy_RETAIN
		return q
	}

	// No queue of the account may name these queues as its dead-letter queue: SQS's move of a
	// failed message is no SendMessage, so their Deny would not stop a forged one, and the
	// consumer (after `sluice redrive`, for a DLQ) would apply it. The queue, the subscription
	// DLQ and a stream consumer's DLQ are no queue's (deny all); the consumer DLQ admits the
	// consumer's queue only (byQueue, set by restrictDeadLetterSource once the queue exists).
	denyAllSources := func(q *awssqs.QueueProps) *awssqs.QueueProps {
		q.RedriveAllowPolicy = &awssqs.RedriveAllowPolicy{RedrivePermission: awssqs.RedrivePermission_DENY_ALL}
		return q
	}
	switch p.sourceKind() {
	case sluiceoutbox.Kinesis, sluiceoutbox.Kafka:
		// The consumer reads the stream or topic itself: no queue. DeadLetterQueue receives
		// the failure records of what keeps failing (addStreamSource).
		c.dlq = awssqs.NewQueue(this, jsii.String("DeadLetterQueue"), denyAllSources(queueProps(p.DeadLetterRetentionPeriod)))
	default:
		c.dlq = awssqs.NewQueue(this, jsii.String("DeadLetterQueue"), queueProps(p.DeadLetterRetentionPeriod))
		c.subDLQ = awssqs.NewQueue(this, jsii.String("SubscriptionDeadLetterQueue"), denyAllSources(queueProps(p.DeadLetterRetentionPeriod)))
		// The queue is no queue's DLQ either: a move into it would bypass its Deny as well.
		qp := denyAllSources(queueProps(p.RetentionPeriod))
		qp.VisibilityTimeout = seconds(p.VisibilityTimeout)
		qp.DeadLetterQueue = &awssqs.DeadLetterQueue{Queue: c.dlq, MaxReceiveCount: jsii.Number(float64(p.MaxReceiveCount))}
		c.queue = awssqs.NewQueue(this, jsii.String("Queue"), qp)
		c.restrictDeadLetterSource()
		if p.sourceKind() == sluiceoutbox.EventBridge {
			c.subscribeBus(&p)
		} else {
			c.subscribeTopic(&p)
		}
	}

	settings, _ := consumerEnvironment(&p) // validated above
	env := map[string]*string{}
	for _, k := range sortedKeys(settings) {
		env[k] = jsii.String(settings[k])
	}
	for k, v := range p.Environment {
		env[k] = jsii.String(v)
	}
	database := p.Database
	var tenancy *fleetTenancy // a fleet consumer's tenants, reached as its fleet's relays reach them
	if p.Fleet != nil {
		tenancy = p.Fleet.Fleet.(*outboxFleet).tenancy // validated above
		database = tenancy.tls
		tenancy.environment(this, env, tenancy.tenants, fmt.Sprintf("Consumer %q", id),
			"a fleet consumer carries every static tenant of its fleet: list them in the fleet's control table (OutboxFleetProps.Registry) instead")
	}
	role := p.DatabaseRole
	if p.Migrations != nil && role == nil {
		role = NewDatabaseRole(this, "DatabaseRole", &DatabaseRoleProps{
			Migrations: p.Migrations, Name: orDefault(p.DatabaseRoleName, roleName(p.Name)), Kind: RoleConsumer, Consumer: p.Name,
			Grants: p.DatabaseGrants, Network: p.Network, Database: p.Database,
		})
	}
	var roleSecret awssecretsmanager.ISecret
	if role != nil {
		roleSecret = role.Secret()
	}
	var via awsec2.IConnectable
	switch {
	case tenancy != nil:
		tenancy.bookConsumer(p.Name, p.Fleet, p.MaxConcurrency, minutesCeil(p.Timeout))
	case p.Proxy != nil:
		via = p.Proxy
		env[lambdaenv.DatabaseHost] = p.Proxy.Endpoint()
		env[lambdaenv.DatabaseQueryExecMode] = jsii.String("exec")
		// The consumer's connections end at the proxy; the database sees the proxy's share.
		p.Migrations.(*migrations).bookProxy(p.Proxy, p.ProxyMaxConnectionsPercent)
	case p.Migrations != nil:
		p.Migrations.UseConnections(fmt.Sprintf("consumer %s %d (maximum concurrency) × %d (pool)", p.Name, p.MaxConcurrency, p.Database.maxConns()),
			p.MaxConcurrency*p.Database.maxConns())
		// The processor schedule's invocations, in every commit mode (an async one's run
		// until their deadline and overlap; the others' usually end at once, booked the same).
		overlap := minutesCeil(p.Timeout)
		p.Migrations.UseConnections(fmt.Sprintf("consumer %s processor %d (overlapping scheduled invocations) × %d (pool)", p.Name, overlap, p.Database.maxConns()),
			overlap*p.Database.maxConns())
	default:
		awscdk.Annotations_Of(this).AddWarningV2(jsii.String("sluice:consumerUsesDatabaseSecret"), jsii.String(
			"UseDatabaseSecret: the consumer's handler code logs in with Database.Secret, not a role of its own; set Migrations to give it one"), nil)
	}
	c.fn = newGoFunction(this, "Function", goFunctionProps{
		secret:       roleSecret,
		via:          via,
		description:  "inbox consumer " + p.Name,
		codeDir:      p.CodeDir,
		timeout:      p.Timeout,
		memoryMB:     p.MemoryMB,
		network:      p.Network,
		database:     database,
		environment:  env,
		logRetention: p.LogRetention,
		// Handler code may call other services through NAT, when the stack has it; the claim
		// check's S3 is reached through the gateway endpoint.
		httpsAnywhere: p.HTTPSToAnywhere,
		s3:            claimCheckS3(p.ClaimCheck != nil, "the claim check's payloads"),
		// A stream's mapping scales with shards or partitions: cap it, as the SQS mapping's
		// MaxConcurrency does, for the connection budget.
		reservedConcurrency: p.streamConcurrency(),
	})
	if p.ClaimCheck != nil {
		p.ClaimCheck.attachConsumer(c.fn)
	}
	if tenancy != nil {
		tenancy.allowFrom(c.fn, "inbox consumer "+p.Name)
		tenancy.grantRead(c.fn.Role(), "the fleet consumer "+p.Name)
	}
	if p.streamSource() {
		c.addStreamSource(&p)
	} else {
		c.addQueueSource(&p)
	}
	if p.Migrations != nil {
		c.fn.Node().AddDependency(p.Migrations.Resource())
	}
	if m, ok := p.Migrations.(*migrations); ok {
		m.audit(p.Name)
	}
	// The same function is the inbox Processor, in every commit mode: each scheduled invocation
	// applies the consumer's stored rows (lambdas/consumer): an async consumer's until shortly
	// before its deadline, the others' (dead letters `sluice dead retry` stored) once.
	// Invocations may overlap, as the relay's do; rows are claimed with SKIP LOCKED, so they
	// share the work.
	c.process = awsevents.NewRule(this, jsii.String("ProcessorSchedule"), &awsevents.RuleProps{
		Description: jsii.String("Starts the inbox processor of consumer " + p.Name + " every minute (stored rows: async messages, retried dead letters)."),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(1))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(c.fn, &awseventstargets.LambdaFunctionProps{
			RetryAttempts: jsii.Number(0),
			MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(1)),
		})},
	})
	suppressLambdaFindings(c.fn)
	c.guardDeadLetterQueues(&p)
	if c.subDLQ != nil {
		suppress(c.subDLQ, "AwsSolutions-SQS3",
			"This queue is the SNS subscription's (or EventBridge rule target's) dead-letter queue (the subscription's "+
				"RedrivePolicy, or the target's DeadLetterConfig, names it); cdk-nag only recognises DLQs of other queues. "+
				"It is alarmed on and drained with `sluice redrive`.")
	}
	return c
}

// guardDeadLetterQueues denies sqs:SendMessage on both DLQs to every principal but the one that
// must write there. A message in a DLQ is redriven to the queue (`sluice redrive`, a message move
// task) past the queue's own Deny, and the consumer applies it: a forged one would be applied too.
//
//   - DeadLetterQueue of an SQS-fed consumer: nobody. SQS moves a message there itself after
//     MaxReceiveCount receives; that move is no SendMessage request of any principal.
//   - DeadLetterQueue of a Kinesis or MSK consumer: only the consumer function's role, as which
//     the event source mapping sends its failure records (aws:PrincipalArn).
//   - SubscriptionDeadLetterQueue: only SNS delivering for the topic, or EventBridge for the
//     rule (aws:SourceArn, which only the service sets; a direct SendMessage has none, and a
//     negated condition on an absent key matches, so the Deny applies).
func (c *consumer) guardDeadLetterQueues(p *ConsumerProps) {
	deny := func(q awssqs.Queue, sid string, condition *map[string]any) {
		q.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String(sid),
			Effect:     awsiam.Effect_DENY,
			Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
			Actions:    jsii.Strings("sqs:SendMessage"),
			Resources:  &[]*string{q.QueueArn()},
			Conditions: condition,
		}))
	}
	if c.subDLQ == nil {
		deny(c.dlq, "OnlyTheConsumersFailureRecords", &map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": c.fn.Role().RoleArn()}})
		return
	}
	deny(c.dlq, "OnlySQSRedriveFillsIt", nil)
	source := c.ruleArn // formatted: the rule depends on this policy
	if source == nil {
		source = p.Topic.TopicArn()
	}
	deny(c.subDLQ, "OnlyTheSourceDeadLetters", &map[string]any{"ArnNotEquals": map[string]any{"aws:SourceArn": source}})
}

// RedriveSourceResourceType is the custom resource that sets the consumer DLQ's
// RedriveAllowPolicy (byQueue: the consumer's queue only).
const RedriveSourceResourceType = "Custom::SluiceDeadLetterSource"

// restrictDeadLetterSource sets the consumer DLQ's RedriveAllowPolicy to byQueue, naming the
// consumer's queue. The queue's RedrivePolicy names the DLQ, so the DLQ's own template cannot
// name the queue (a dependency cycle): a custom resource sets the attribute once both exist,
// and again whenever the queue is replaced.
func (c *consumer) restrictDeadLetterSource() {
	policy := awscdk.Fn_Join(jsii.String(""), &[]*string{
		jsii.String(`{"redrivePermission":"byQueue","sourceQueueArns":["`), c.queue.QueueArn(), jsii.String(`"]}`),
	})
	set := &customresources.AwsSdkCall{
		Service: jsii.String("SQS"), Action: jsii.String("setQueueAttributes"),
		Parameters:         map[string]any{"QueueUrl": c.dlq.QueueUrl(), "Attributes": map[string]any{"RedriveAllowPolicy": policy}},
		PhysicalResourceId: customresources.PhysicalResourceId_Of(c.dlq.QueueArn()),
	}
	cr := customresources.NewAwsCustomResource(c, jsii.String("DeadLetterSource"), &customresources.AwsCustomResourceProps{
		ResourceType: jsii.String(RedriveSourceResourceType),
		OnCreate:     set, OnUpdate: set,
		Policy: customresources.AwsCustomResourcePolicy_FromStatements(&[]awsiam.PolicyStatement{awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions: jsii.Strings("sqs:SetQueueAttributes"), Resources: &[]*string{c.dlq.QueueArn()},
		})}),
		InstallLatestAwsSdk: jsii.Bool(false),
	})
	suppressAwsCustomResource(cr)
}

// addQueueSource reads the queue with an SQS event source mapping that reports batch item
// failures.
func (c *consumer) addQueueSource(p *ConsumerProps) {
	esp := &awslambdaeventsources.SqsEventSourceProps{
		BatchSize:               jsii.Number(float64(p.BatchSize)),
		ReportBatchItemFailures: jsii.Bool(true),
		MaxConcurrency:          jsii.Number(float64(p.MaxConcurrency)),
	}
	if p.MaxBatchingWindow > 0 {
		esp.MaxBatchingWindow = seconds(p.MaxBatchingWindow)
	}
	c.fn.AddEventSource(awslambdaeventsources.NewSqsEventSource(c.queue, esp))
}

// subscribeTopic subscribes the queue to the SNS topic, with raw delivery and its own DLQ.
func (c *consumer) subscribeTopic(p *ConsumerProps) {
	// The subscription, the queue policy and the key policy by hand (not SqsSubscription), so
	// that SNS may use the key only for this topic: every statement for sns.amazonaws.com is
	// scoped by aws:SourceArn.
	fromTopic := &map[string]any{"ArnEquals": map[string]any{"aws:SourceArn": p.Topic.TopicArn()}}
	sns := awsiam.NewServicePrincipal(jsii.String("sns.amazonaws.com"), nil)
	queuePolicy := c.queue.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("TopicDelivers"),
		Principals: &[]awsiam.IPrincipal{sns},
		Actions:    jsii.Strings("sqs:SendMessage"),
		Resources:  &[]*string{c.queue.QueueArn()},
		Conditions: fromTopic,
	}))
	// Nobody else may send: a message in this queue is applied by the consumer, so a forged
	// one would be too. The Deny wins over any identity policy in the account; the listed
	// redrivers (operators moving messages back from the DLQs) are the only exception.
	// Requests without aws:SourceArn (every direct SendMessage) match ArnNotEquals.
	redrivers := []any{}
	for _, a := range p.Redrivers {
		redrivers = append(redrivers, a)
	}
	notFromTopic := map[string]any{"ArnNotEquals": map[string]any{"aws:SourceArn": p.Topic.TopicArn()}}
	if len(redrivers) > 0 {
		notFromTopic["ArnNotEquals"] = map[string]any{"aws:SourceArn": p.Topic.TopicArn(), "aws:PrincipalArn": redrivers}
	}
	c.queue.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("OnlyTheTopicAndRedriversSend"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("sqs:SendMessage"),
		Resources:  &[]*string{c.queue.QueueArn()},
		Conditions: &notFromTopic,
	}))
	c.queueKey.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("TopicEncryptsForTheQueues"),
		Principals: &[]awsiam.IPrincipal{sns},
		Actions:    jsii.Strings("kms:Decrypt", "kms:GenerateDataKey*"),
		Resources:  jsii.Strings("*"),
		Conditions: fromTopic,
	}), nil)
	subProps := &awssns.SubscriptionProps{
		Topic:              p.Topic,
		Endpoint:           c.queue.QueueArn(),
		Protocol:           awssns.SubscriptionProtocol_SQS,
		RawMessageDelivery: jsii.Bool(true),
		DeadLetterQueue:    c.subDLQ,
	}
	if len(p.FilterPolicy) > 0 {
		fp := make(map[string]awssns.SubscriptionFilter, len(p.FilterPolicy))
		for k, v := range p.FilterPolicy {
			fp[k] = v
		}
		subProps.FilterPolicy = &fp
	}
	c.sub = awssns.NewSubscription(c, jsii.String("Subscription"), subProps)
	if queuePolicy.PolicyDependable != nil {
		c.sub.Node().AddDependency(queuePolicy.PolicyDependable)
	}
}
