package infra

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/partition"
)

// RelaySchedule is how often EventBridge starts a relay invocation (EventBridge's floor). Each
// invocation keeps polling until shortly before its timeout, so invocations overlap.
const RelaySchedule = time.Minute

// DefaultRelayMemoryMB is OutboxProps.RelayMemoryMB's default. A claim holds at most BatchSize
// (500) rows per pipeline (2); at 256 MB, 1,000 pending 250 KB rows drove the relay to 639 MB
// (issue 10). 512 MB (GOMEMLIMIT 460 MiB) leaves a full claim of rows up to ~100 KB its
// payload, its copy in the SNS request and the rest of the process; the relay's own byte
// budget, derived from the function's memory, bounds claims of larger payloads.
const DefaultRelayMemoryMB = 512

// OutboxProps configure an Outbox.
type OutboxProps struct {
	// RelayCodeDir is a directory holding the relay's `bootstrap` (bin/relay after `make build`). Required.
	RelayCodeDir string
	// Network places the relay in the database's VPC. Network.Vpc is required.
	Network Network
	// Database is how the relay reaches PostgreSQL. Database.Secret is required. The relay always
	// connects to the database itself, never through an RDS Proxy: its rounds hold their
	// partition keys' row locks in a transaction, which a proxy would pin anyway.
	Database Database
	// Migrations, when set, creates the relay's own database role (DatabaseRole; read and update
	// outbox_event, read outbox_control) with its own rotated secret, so the relay never logs in
	// as Database.Secret's user; the relay is created after the migrations ran, and its
	// connections are booked against the migrations' connection budget. Required unless
	// UseDatabaseSecret.
	Migrations Migrations
	// UseDatabaseSecret makes the relay log in with Database.Secret itself (typically the owner
	// or the master user) instead of a role of its own. It is the explicit choice for a stack
	// without Migrations: synthesis fails when neither is set, and warns when this is. Defaults
	// to false.
	UseDatabaseSecret bool
	// DatabaseRole is the relay's role name with Migrations. Defaults to "sluice_relay".
	DatabaseRole string
	// Publishers are further IAM principal ARNs (roles) allowed to publish to the topic, e.g. an
	// operator role that runs `sluice relay` or `sluice replay`. The topic policy denies
	// sns:Publish to every other principal but the relay's role. Defaults to none.
	Publishers []string
	// Subscribers are further endpoints allowed to subscribe to the topic, e.g. the queue ARN
	// of a consumer in another stack. The topic policy denies sns:Subscribe for any endpoint
	// but these and those of the topic's subscriptions in this stack (ConsumerProps.Topic), so
	// that nobody copies the outbox's events elsewhere. Defaults to none.
	Subscribers []string

	// Fifo makes the topic a FIFO topic (MessageGroupId = partition_key, dedup id = event_id).
	// Defaults to a standard topic.
	Fifo bool
	// TopicName is the SNS topic's physical name; ".fifo" is appended to FIFO names that lack it.
	// Defaults to a generated name.
	TopicName string
	// TopicKey encrypts the topic. Defaults to a new customer-managed key with rotation.
	TopicKey awskms.IKey
	// LogicalTopics are the outbox_event.topic values routed to this construct's topic. When
	// empty, the topic is the relay's default topic and receives every row not routed elsewhere.
	LogicalTopics []string
	// DefaultToTopic makes this construct's topic the default even when LogicalTopics is set.
	// Defaults to false (rows with an unknown topic are quarantined) unless LogicalTopics is empty.
	DefaultToTopic bool
	// ExtraTopics routes further logical topics to existing SNS topics; the relay may publish to
	// them (and use their keys, when the topic objects know them).
	ExtraTopics map[string]awssns.ITopic
	// Destinations routes further logical topics to EventBridge buses, Kinesis streams and Kafka
	// topics on MSK (NewEventBridgeDestination, NewKinesisDestination, NewMskDestination); the
	// relay gets the permissions, settings and network access each needs. One relay puts events
	// with one EventBridge Source and produces to one MSK cluster. Defaults to none.
	Destinations map[string]Destination
	// DefaultDestination receives the rows whose topic nothing routes, instead of the SNS topic
	// (which is still created, for ExtraTopics-style routing by name). Not with DefaultToTopic.
	// Defaults to none.
	DefaultDestination Destination

	// RelayTimeout is the relay Lambda's timeout, i.e. how long one invocation keeps polling.
	// Between 10 seconds and 15 minutes. Defaults to 5 minutes.
	RelayTimeout time.Duration
	// RelayStopBefore is how long before its deadline an invocation stops claiming rows; shorter
	// than RelayTimeout. Defaults to the relay's own default (5s).
	RelayStopBefore time.Duration
	// RelayReservedConcurrency caps concurrent relays (and so their database connections). It must
	// cover the overlap of scheduled invocations: at least ceil(RelayTimeout / 1 minute).
	// Defaults to that overlap plus one.
	RelayReservedConcurrency int
	// RelayMemoryMB is the relay's memory; GOMEMLIMIT is set to 90% of it, and the relay sizes
	// its per-round payload budget from it (AWS_LAMBDA_FUNCTION_MEMORY_SIZE). Defaults to
	// DefaultRelayMemoryMB.
	RelayMemoryMB int
	// Relay tunes the relay (batch size, lease, backoff, ...): the settings `sluice relay` and
	// the relay Lambda read from the environment. Defaults to the relay's own defaults.
	Relay RelaySettings
	// OutboxRetention is the retention of a partitioned outbox_event (SLUICE_OUTBOX_RETENTION):
	// partition maintenance drops the partitions whose rows were all published longer ago. With
	// Migrations it is the migrations function's scheduled maintenance
	// (MigrationsProps.OutboxRetention, which this sets); with UseDatabaseSecret each relay
	// invocation maintains the partitions itself, as Database.Secret's user. A plain
	// outbox_event is never changed. Defaults to 0: nothing is dropped.
	OutboxRetention time.Duration
	// OutboxPartitionInterval is how long a new partition of a partitioned outbox_event should
	// take to fill (SLUICE_OUTBOX_PARTITION_INTERVAL), for the same maintenance. Defaults to
	// partition.DefaultInterval (24h).
	OutboxPartitionInterval time.Duration
	// LogRetention is the relay log group's retention. Defaults to one month.
	LogRetention awslogs.RetentionDays
	// RelayService runs the relay as an ECS Fargate service (examples/relay) instead of the
	// scheduled Lambda: no function, no schedule; RelayCodeDir, RelayTimeout, RelayStopBefore,
	// RelayReservedConcurrency and RelayMemoryMB do not apply. Defaults to nil: the Lambda.
	RelayService *RelayServiceProps
	// ClaimCheck is the bucket (NewClaimCheck) where the relay stores payloads too large for
	// their message, publishing a pointer instead: the relay gets SLUICE_CLAIM_CHECK_*, may put
	// objects there, and HTTPS to S3 (Network.S3PrefixList, the gateway endpoint's prefix list;
	// any address without it). Defaults to none: such rows are quarantined.
	ClaimCheck ClaimCheck
}

// Outbox is an SNS topic plus the relay Lambda that publishes committed outbox rows to it.
type Outbox interface {
	constructs.IConstruct
	// Topic is the topic the relay publishes to; nil when no row can go to it (every logical
	// topic and the default destination are other destinations).
	Topic() awssns.ITopic
	// TopicKey is the KMS key encrypting Topic (nil without Topic).
	TopicKey() awskms.IKey
	// Relay is the relay Lambda; nil with OutboxProps.RelayService.
	Relay() awslambda.IFunction
	// Schedule is the EventBridge rule starting the relay every minute; nil with
	// OutboxProps.RelayService.
	Schedule() awsevents.Rule
	// RelayService is the relay's Fargate service with OutboxProps.RelayService; nil otherwise.
	RelayService() awsecs.FargateService
	// Fifo reports whether Topic is a FIFO topic.
	Fifo() bool
}

type outbox struct {
	constructs.Construct
	topic    awssns.ITopic
	key      awskms.IKey
	relay    awslambda.Function
	schedule awsevents.Rule
	service  awsecs.FargateService
	// serviceLogs is the relay service's log group; nil for the Lambda.
	serviceLogs awslogs.LogGroup
	fifo        bool
}

func (o *outbox) Topic() awssns.ITopic {
	if o.topic == nil {
		return nil // no typed nil inside the interface
	}
	return o.topic
}
func (o *outbox) TopicKey() awskms.IKey { return o.key }
func (o *outbox) Relay() awslambda.IFunction {
	if o.relay == nil {
		return nil // no typed nil inside the interface
	}
	return o.relay
}
func (o *outbox) Schedule() awsevents.Rule            { return o.schedule }
func (o *outbox) RelayService() awsecs.FargateService { return o.service }
func (o *outbox) Fifo() bool                          { return o.fifo }

func (p *OutboxProps) withDefaults() OutboxProps {
	out := *p
	out.RelayTimeout = orDefault(out.RelayTimeout, 5*time.Minute)
	if out.RelayReservedConcurrency == 0 {
		out.RelayReservedConcurrency = minutesCeil(out.RelayTimeout) + 1
	}
	out.RelayMemoryMB = orDefault(out.RelayMemoryMB, DefaultRelayMemoryMB)
	out.DatabaseRole = orDefault(out.DatabaseRole, "sluice_relay")
	out.LogRetention = orDefault(out.LogRetention, awslogs.RetentionDays_ONE_MONTH)
	return out
}

func (p *OutboxProps) validate() error {
	errs := []error{p.Database.validate(), p.validateRelay()}
	switch {
	case p.Migrations == nil && !p.UseDatabaseSecret:
		errs = append(errs, errors.New("Migrations is not set, so the relay would log in with Database.Secret (the owner's or master credentials): "+
			"set Migrations to give the relay a role of its own (recommended), or UseDatabaseSecret to log in with Database.Secret knowingly"))
	case p.Migrations != nil && p.UseDatabaseSecret:
		errs = append(errs, errors.New("UseDatabaseSecret and Migrations exclude each other: with Migrations the relay logs in with its own role"))
	case p.Migrations != nil:
		if m, ok := p.Migrations.(*migrations); ok {
			if err := m.checkOutboxPartitions(p.OutboxRetention, p.OutboxPartitionInterval); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// validateRelay checks what every relay deployment shares, one database's (Outbox) or a
// fleet's (OutboxFleet): the network, the relay's function or service, its settings, topics
// and destinations.
func (p *OutboxProps) validateRelay() error {
	errs := []error{p.Network.validate()}
	if p.RelayService == nil {
		errs = append(errs, checkAssetDir("RelayCodeDir", p.RelayCodeDir))
	} else {
		s := p.RelayService.withDefaults()
		errs = append(errs, s.validate())
	}
	if p.RelayTimeout < 10*time.Second || p.RelayTimeout > 15*time.Minute {
		errs = append(errs, fmt.Errorf("RelayTimeout must be between 10s and 15m, got %s", p.RelayTimeout))
	}
	if p.RelayStopBefore < 0 || (p.RelayStopBefore > 0 && p.RelayStopBefore >= p.RelayTimeout) {
		errs = append(errs, fmt.Errorf("RelayStopBefore must be positive and shorter than RelayTimeout (%s), got %s", p.RelayTimeout, p.RelayStopBefore))
	}
	if need := minutesCeil(p.RelayTimeout); p.RelayReservedConcurrency < need {
		errs = append(errs, fmt.Errorf("RelayReservedConcurrency %d is below the %d overlapping invocations a %s timeout with a 1-minute schedule needs; scheduled invocations would be throttled",
			p.RelayReservedConcurrency, need, p.RelayTimeout))
	}
	if p.RelayMemoryMB < 128 {
		errs = append(errs, fmt.Errorf("RelayMemoryMB must be at least 128, got %d", p.RelayMemoryMB))
	}
	for i, a := range p.Publishers {
		if !strings.HasPrefix(a, "arn:") {
			errs = append(errs, fmt.Errorf("Publishers[%d] %q is not an ARN", i, a))
		}
	}
	if _, err := relayEnvironment(p.Relay, p.RelayMemoryMB); err != nil {
		errs = append(errs, err)
	}
	if p.OutboxRetention < 0 {
		errs = append(errs, fmt.Errorf("OutboxRetention must not be negative, got %s", p.OutboxRetention))
	}
	if p.OutboxPartitionInterval != 0 {
		if err := (&partition.Options{Interval: p.OutboxPartitionInterval}).Check(); err != nil {
			errs = append(errs, fmt.Errorf("OutboxPartitionInterval: %w", err))
		}
	}
	seen := map[string]bool{}
	for _, t := range p.LogicalTopics {
		if t == "" {
			errs = append(errs, errors.New("LogicalTopics must not contain an empty name"))
		}
		if seen[t] {
			errs = append(errs, fmt.Errorf("LogicalTopics lists %q twice", t))
		}
		seen[t] = true
	}
	errs = append(errs, checkDestinations(p)...)
	for name, t := range p.ExtraTopics {
		if seen[name] {
			errs = append(errs, fmt.Errorf("logical topic %q is both in LogicalTopics and ExtraTopics", name))
		}
		if t == nil || name == "" {
			errs = append(errs, fmt.Errorf("ExtraTopics entry %q must have a name and a topic", name))
		}
	}
	return errors.Join(errs...)
}

// NewOutbox creates the topic, the relay Lambda and its one-minute schedule. It panics on invalid
// props, naming every problem.
func NewOutbox(scope constructs.Construct, id string, props *OutboxProps) Outbox {
	p := props.withDefaults()
	invalid("Outbox", id, p.validate())

	o := &outbox{fifo: p.Fifo}
	constructs.NewConstruct_Override(o, scope, &id) // o itself is the jsii construct, so it can be passed to CDK APIs
	this := o

	o.topic, o.key = newRelayTopic(this, &p)
	env := relayRouting(this, &p, o.topic)
	if p.Migrations == nil {
		// Logged in as Database.Secret's user (UseDatabaseSecret), the relay maintains a
		// partitioned outbox itself: setting the interval is what asks it to.
		if p.OutboxRetention > 0 {
			env[lambdaenv.OutboxRetention] = jsii.String(p.OutboxRetention.String())
		}
		env[lambdaenv.OutboxPartitionInterval] = jsii.String(orDefault(p.OutboxPartitionInterval, partition.DefaultInterval).String())
		awscdk.Annotations_Of(this).AddWarningV2(jsii.String("sluice:relayUsesDatabaseSecret"), jsii.String(
			"UseDatabaseSecret: the relay logs in with Database.Secret, not a role of its own; set Migrations to give it one"), nil)
	}

	var roleSecret awssecretsmanager.ISecret
	if p.Migrations != nil {
		// The relay's role may not create or drop tables: the migrations function, which logs
		// in as the owner, maintains the partitions on its schedule.
		p.Migrations.(*migrations).maintainOutbox(p.OutboxRetention, p.OutboxPartitionInterval)
		rp := &DatabaseRoleProps{Migrations: p.Migrations, Name: p.DatabaseRole, Kind: RoleRelay, Network: p.Network, Database: p.Database}
		if p.RelayService != nil {
			rp.WALPublication = p.RelayService.WALPublication
		}
		role := NewDatabaseRole(this, "DatabaseRole", rp)
		roleSecret = role.Secret()
	}
	var host relayHost
	if p.RelayService != nil {
		rs := newRelayService(this, &p, env, roleSecret)
		o.service, o.serviceLogs, host = rs.service, rs.logs, rs
		if p.Migrations != nil {
			n, perTask, what := p.RelayService.withDefaults().DesiredCount, p.Database.maxConns(), "(pool)"
			if p.RelayService.WALPublication != "" {
				perTask, what = perTask+1, "(pool + its replication connection)"
			}
			p.Migrations.UseConnections(fmt.Sprintf("relay service %d (tasks) × %d %s", n, perTask, what), n*perTask)
			rs.service.Node().AddDependency(p.Migrations.Resource())
		}
	} else {
		if p.Migrations != nil {
			p.Migrations.UseConnections(fmt.Sprintf("relay %d (reserved concurrency) × %d (pool)", p.RelayReservedConcurrency, p.Database.maxConns()),
				p.RelayReservedConcurrency*p.Database.maxConns())
		}
		o.relay, o.schedule = newRelayFunction(this, &p, goFunctionProps{
			description: "outbox relay",
			secret:      roleSecret,
			network:     p.Network,
			database:    p.Database,
			environment: env,
		})
		if p.Migrations != nil {
			o.relay.Node().AddDependency(p.Migrations.Resource())
		}
		host = lambdaRelay{o.relay}
	}
	attachRelay(this, &p, o.topic, host)
	if o.relay != nil {
		suppressTopicKeyGrant(o.relay)
	}
	return o
}

// newRelayTopic creates the outbox's own topic and its key (unless OutboxProps.TopicKey), when
// a row can go to it; nil, nil otherwise.
func newRelayTopic(this constructs.Construct, p *OutboxProps) (awssns.ITopic, awskms.IKey) {
	// The outbox's own topic exists only when a row can go to it: a logical topic mapped to it,
	// or the default destination. A relay whose every destination is another kind (EventBridge,
	// Kinesis, MSK, other topics) gets no topic, key or SNS permission.
	if p.DefaultDestination != nil && len(p.LogicalTopics) == 0 && !p.DefaultToTopic {
		return nil, nil
	}
	key := p.TopicKey
	if key == nil {
		key = newKey(this, "TopicKey", "sluice outbox topic encryption")
	}
	topicProps := &awssns.TopicProps{
		Fifo:       jsii.Bool(p.Fifo),
		MasterKey:  key,
		EnforceSSL: jsii.Bool(true),
	}
	if p.TopicName != "" {
		name := p.TopicName
		if p.Fifo && (len(name) < 5 || name[len(name)-5:] != ".fifo") {
			name += ".fifo"
		}
		topicProps.TopicName = jsii.String(name)
	}
	return awssns.NewTopic(this, jsii.String("Topic"), topicProps), key
}

// relayRouting is the relay's environment for routing rows (the logical topics' addresses and
// the default destination) and its settings, as every relay of p reads it.
func relayRouting(this constructs.Construct, p *OutboxProps, topic awssns.ITopic) map[string]*string {
	topicMap := map[string]any{}
	for _, t := range p.LogicalTopics {
		topicMap[t] = topic.TopicArn()
	}
	for _, name := range sortedKeys(p.ExtraTopics) {
		topicMap[name] = p.ExtraTopics[name].TopicArn()
	}
	for name, d := range p.Destinations {
		topicMap[name] = d.Address()
	}
	env := map[string]*string{
		lambdaenv.TopicARNs: awscdk.Stack_Of(this).ToJsonString(topicMap, nil),
	}
	switch {
	case p.DefaultDestination != nil:
		env[lambdaenv.DefaultTopicARN] = p.DefaultDestination.Address()
	case len(p.LogicalTopics) == 0 || p.DefaultToTopic:
		env[lambdaenv.DefaultTopicARN] = topic.TopicArn()
	}
	if p.RelayStopBefore > 0 {
		env[lambdaenv.RelayStopBefore] = jsii.String(p.RelayStopBefore.String())
	}
	memoryMB := p.RelayMemoryMB
	if p.RelayService != nil {
		memoryMB = p.RelayService.withDefaults().MemoryMiB
	}
	settings, _ := relayEnvironment(p.Relay, memoryMB) // validated with the props
	for _, k := range sortedKeys(settings) {
		env[k] = jsii.String(settings[k])
	}
	return env
}

// attachRelay gives the relay (host) what it publishes with: the claim check, the topic (whose
// policy then denies publishing to anyone else), the extra topics and the destinations.
func attachRelay(this constructs.Construct, p *OutboxProps, topic awssns.ITopic, host relayHost) {
	if p.ClaimCheck != nil {
		p.ClaimCheck.attachRelay(host)
	}
	if topic != nil {
		topic.GrantPublish(host.Grantee())
		// Only the relay (and the listed publishers) may publish.
		topic.AddToResourcePolicy(onlyTheRelay("OnlyTheRelayPublishes", host, p.Publishers, topic.TopicArn(), "sns:Publish"))
		// Only the stack's own subscriptions (and the listed Subscribers) may subscribe: whoever
		// may call sns:Subscribe would otherwise receive every event. The endpoints are read from
		// the stack's subscriptions to the topic when the template is synthesized, so consumers
		// created after the outbox are included.
		topic.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("OnlyTheStacksSubscriptions"),
			Effect:     awsiam.Effect_DENY,
			Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
			Actions:    jsii.Strings("sns:Subscribe"),
			Resources:  &[]*string{topic.TopicArn()},
			Conditions: &map[string]any{"StringNotEquals": map[string]any{
				"sns:Endpoint": awscdk.Lazy_List(&topicSubscribers{stack: awscdk.Stack_Of(this), topic: topic.TopicArn(), extra: p.Subscribers}, nil),
			}},
		}))
	}
	for _, name := range sortedKeys(p.ExtraTopics) {
		p.ExtraTopics[name].GrantPublish(host.Grantee())
	}
	bindDestinations(host, p)
}

// suppressTopicKeyGrant records why the relay's kms:GenerateDataKey* is acceptable.
func suppressTopicKeyGrant(c constructs.IConstruct) {
	suppress(c, "AwsSolutions-IAM5",
		"Publishing to a KMS-encrypted SNS topic needs kms:GenerateDataKey* (GenerateDataKey and its variants); "+
			"the statement is limited to the topic keys' ARNs, as Topic.GrantPublish writes it.",
		"Action::kms:GenerateDataKey*")
}

// newRelayFunction creates a relay Lambda in scope ("Relay") and the one-minute schedule that
// starts it ("RelaySchedule"): an Outbox's relay, or each shard's of an OutboxFleet. f says
// how it logs in, where it runs and its environment; p gives the rest. The caller books its
// connections.
func newRelayFunction(scope constructs.Construct, p *OutboxProps, f goFunctionProps) (awslambda.Function, awsevents.Rule) {
	f.codeDir = p.RelayCodeDir
	f.timeout = p.RelayTimeout
	f.memoryMB = p.RelayMemoryMB
	f.reservedConcurrency = p.RelayReservedConcurrency
	f.s3 = claimCheckS3(p.ClaimCheck != nil, "the claim check's payloads")
	f.logRetention = p.LogRetention
	fn := newGoFunction(scope, "Relay", f)
	// The schedule starts a fresh invocation every minute; retrying a failed one would only add
	// a duplicate poller.
	fn.ConfigureAsyncInvoke(&awslambda.EventInvokeConfigOptions{
		RetryAttempts: jsii.Number(0),
		MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(1)),
	})
	schedule := awsevents.NewRule(scope, jsii.String("RelaySchedule"), &awsevents.RuleProps{
		Description: jsii.String("Starts a sluice relay invocation every minute; invocations overlap."),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(RelaySchedule.Minutes()))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(fn, &awseventstargets.LambdaFunctionProps{
			RetryAttempts: jsii.Number(2),
			MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(1)),
		})},
	})
	suppressLambdaFindings(fn)
	return fn, schedule
}

// topicSubscribers produces the endpoints allowed to subscribe to an outbox topic: those of the
// stack's AWS::SNS::Subscription resources on it, and extra.
type topicSubscribers struct {
	stack awscdk.Stack
	topic *string
	extra []string
}

// Produce implements awscdk.IStableListProducer.
func (t *topicSubscribers) Produce() *[]*string {
	want := t.stack.Resolve(t.topic)
	var out []*string
	for _, c := range *t.stack.Node().FindAll(constructs.ConstructOrder_PREORDER) {
		if sub, ok := c.(awssns.CfnSubscription); ok && reflect.DeepEqual(t.stack.Resolve(sub.TopicArn()), want) {
			out = append(out, sub.Endpoint())
		}
	}
	for _, e := range t.extra {
		out = append(out, jsii.String(e))
	}
	if len(out) == 0 {
		// No subscription: the topic's own ARN, which no Subscribe names as its endpoint, so
		// that every Subscribe is denied (an empty list would make the condition meaningless).
		out = append(out, t.topic)
	}
	return &out
}
