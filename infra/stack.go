package infra

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecrassets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsrds"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/customresources"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	sluiceoutbox "github.com/sluicehq/sluice/pkg/outbox"
)

// ExistingDatabase names a PostgreSQL database the stack uses instead of creating one.
type ExistingDatabase struct {
	// SecretARN is the complete ARN (with its 6-character suffix) of a Secrets Manager secret in
	// the RDS JSON shape. Required.
	SecretARN string
	// SecurityGroupID is the database's security group; the stack adds ingress rules from the
	// Lambdas to it. Optional: without it, allow the Lambdas' security groups yourself.
	SecurityGroupID string
	// Port is the database port. Defaults to 5432.
	Port int
	// MaxConnections is the database's max_connections, for the synth-time connection check
	// and the connections alarm. Defaults to 0: not checked (synthesis warns).
	MaxConnections int
	// InstanceIdentifier is the RDS DB instance identifier, for the database alarms (CPU,
	// memory, storage, connections with MaxConnections, transaction ID age). Defaults to none:
	// no database alarms.
	InstanceIdentifier string
}

// SluiceStackProps configure the example stack.
type SluiceStackProps struct {
	awscdk.StackProps
	// RelayCodeDir, ConsumerCodeDir and MigrateCodeDir are directories holding the Lambdas'
	// `bootstrap` files (bin/relay, bin/consumer, bin/migrate after `make build`). Required.
	RelayCodeDir, ConsumerCodeDir, MigrateCodeDir string
	// RelayImageDir, when set, runs the relay as a Fargate service (OutboxProps.RelayService)
	// from the container image built in this directory (bin/relay-service after `make build`:
	// examples/relay with its Dockerfile) instead of the scheduled Lambda. Defaults to "": the
	// Lambda.
	RelayImageDir string
	// WALWakeup, with RelayImageDir, has the relay tasks follow the WAL for new rows instead of
	// polling (RelayServiceProps.WALPublication "sluice_outbox"): the new database gets
	// rds.logical_replication=1 and max_slot_wal_keep_size, the relay's role the publication
	// and rds_replication, and an alarm watches the replication slots' lag. Defaults to false.
	WALWakeup bool

	// VpcID imports an existing VPC (looked up at synth time; needs an account and region in
	// StackProps.Env). It must have private subnets with egress. Defaults to a new VPC.
	VpcID string
	// Database imports an existing database. Defaults to a new RDS PostgreSQL instance.
	Database *ExistingDatabase
	// MultiAZ makes the new database Multi-AZ. Defaults to true.
	MultiAZ *bool
	// InstanceType is the new database's instance type. Defaults to t4g.small.
	InstanceType awsec2.InstanceType
	// MaxConnections is the new database's max_connections (set in its parameter group) and the
	// connection budget the functions are checked against at synth. Defaults to
	// DefaultMaxConnections for the default instance type; required with another InstanceType.
	MaxConnections int
	// NatGateways is the number of NAT gateways. The functions reach AWS through interface VPC
	// endpoints (Secrets Manager, SNS) and the S3 gateway endpoint, so they need none; with
	// NatGateways > 0 the Lambda subnets get a route to the internet too, and the consumer's
	// security group allows HTTPS to any address (handler code that calls other services;
	// ConsumerProps.HTTPSToAnywhere). The relay's still allows only the endpoints. Defaults to 0.
	NatGateways int
	// ConsumerProxy puts an RDS Proxy between the example consumer and the database. Defaults to false.
	ConsumerProxy bool
	// CABundle is the PEM file of the RDS certificate authorities the functions verify the
	// database with (Database.CABundle). Required.
	CABundle string
	// Publishers are IAM role ARNs allowed to publish to the topic besides the relay (OutboxProps.Publishers).
	Publishers []string
	// Redrivers are IAM role ARNs allowed to send to the consumer's queue besides the topic,
	// e.g. the operator role of `sluice redrive` (ConsumerProps.Redrivers).
	Redrivers []string
	// OutboxRetention and InboxRetention are the retentions of a partitioned outbox_event and
	// inbox_event, applied by the migrations function's hourly partition maintenance
	// (MigrationsProps). Default to 0: partitions are created ahead, none is dropped.
	OutboxRetention, InboxRetention time.Duration

	// Fifo makes the topic and the consumer's queues FIFO. Defaults to standard.
	Fifo bool
	// Destination is the broker between the relay and the example consumer: DestinationSNS
	// (the outbox's topic), DestinationEventBridge (a new bus; the consumer's queue is its
	// rule's target), DestinationKinesis (a new on-demand stream) or DestinationMSK (a Kafka
	// topic on MskClusterArn, or on a new MSK Serverless cluster); the relay's default
	// destination is that one. The VPC gets the interface endpoints it needs. Defaults to SNS.
	Destination string
	// MskClusterArn is an existing MSK cluster (IAM client authentication on) for
	// DestinationMSK, and MskSecurityGroupID its security group, which gets ingress from the
	// relay. Default to a new MSK Serverless cluster in the stack's VPC.
	MskClusterArn, MskSecurityGroupID string
	// MskTopic is DestinationMSK's Kafka topic: it must exist (on Serverless, create it with
	// Kafka's admin tools). Defaults to DefaultMskTopic.
	MskTopic string
	// ConsumerName is the example consumer's inbox name. Defaults to "example".
	ConsumerName string
	// Relay tunes the relay (OutboxProps.Relay). Defaults to the relay's own defaults.
	Relay RelaySettings
	// ConsumerMaxConcurrency caps the example consumer's concurrent invocations
	// (ConsumerProps.MaxConcurrency, 2..1000): with batches of 10 taking 100 ms each, 5 serve
	// 500 events a second, 20 serve 2,000. Its connections count against MaxConnections.
	// Defaults to the consumer's default (5).
	ConsumerMaxConcurrency int
	// MaxAllocatedStorageGB is the ceiling up to which RDS grows the new database's storage
	// (from 20 GB). Defaults to 200.
	MaxAllocatedStorageGB int
	// ConsumerCommitMode, ConsumerDeadlineMargin and ConsumerStorePayload set the example
	// consumer's ConsumerProps.CommitMode, DeadlineMargin and StorePayload. Default to the
	// consumer's defaults (per-record, 3 seconds, false).
	ConsumerCommitMode     string
	ConsumerDeadlineMargin time.Duration
	ConsumerStorePayload   bool
	// AlarmEmail, when set, receives the alarm notifications.
	AlarmEmail string
	// AlarmTopicArn, when set, is an existing SNS topic (with its subscribers) that receives the
	// alarm notifications instead of a new one.
	AlarmTopicArn string
	// NoAlarmDestination deploys without AlarmEmail or AlarmTopicArn: alarms that reach nobody.
	// One of the three is required.
	NoAlarmDestination bool
	// ClaimCheck, when set, creates the claim check's bucket (NewClaimCheck) for payloads
	// above the topic's limit, written by the relay and read by the consumer. Defaults to none.
	ClaimCheck *ClaimCheckProps
	// Fleet, when above 0, adds an OutboxFleet (NewOutboxFleet) of this many tenant databases
	// on the stack's own database instance, with a topic of its own: tenant I (tenant-I) gets
	// a secret for role sluice_tenant_I and database tenant_I with a generated password,
	// which the operator creates and migrates after the deploy (docs/deploy.md, "Deploying a
	// fleet"). A second consumer, ConsumerName + "-fleet" (the same code, ConsumerProps.Fleet),
	// subscribes to the fleet's topic and applies each message in its tenant's database. The
	// fleet's relays book ExampleFleetRelayConnections per instance, and its consumer its own,
	// on the instance's connection budget, beside the stack's other functions. At most
	// MaxExampleFleet. Defaults to 0: no fleet.
	Fleet int
	// FleetShards is the fleet's OutboxFleetProps.Shards. Defaults to 1.
	FleetShards int
}

// MaxExampleFleet is the largest SluiceStackProps.Fleet: the fleet consumer carries every
// tenant's secret ARN in its environment, and Lambda's 4 KB hold about 20 (a larger fleet
// lists its tenants in a control table, OutboxFleetProps.Registry).
const MaxExampleFleet = 20

// ExampleFleetRelayConnections is the example fleet's FleetServer.RelayConnections on the
// stack's database instance.
const ExampleFleetRelayConnections = 10

// DefaultMaxConnections is max_connections of the example's default t4g.small (2 GiB): RDS's
// own default, LEAST(DBInstanceClassMemory/9531392, 5000), is about 190-225 on that class; 200
// makes the budget exact.
const DefaultMaxConnections = 200

// SluiceStack is the example deployment: network, database, migrations, outbox, one consumer,
// alarms and dashboard.
type SluiceStack interface {
	awscdk.Stack
	// Outbox is the outbox construct.
	Outbox() Outbox
	// Consumer is the example consumer.
	Consumer() Consumer
	// Migrations is the migrations custom resource.
	Migrations() Migrations
	// Monitoring holds the alarms and dashboard.
	Monitoring() Monitoring
	// DatabaseSecret holds the database credentials.
	DatabaseSecret() awssecretsmanager.ISecret
	// Fleet is the outbox fleet with SluiceStackProps.Fleet; nil otherwise.
	Fleet() OutboxFleet
	// FleetConsumer is the consumer applying the fleet's messages in its tenants' databases
	// with SluiceStackProps.Fleet; nil otherwise.
	FleetConsumer() Consumer
}

type sluiceStack struct {
	awscdk.Stack
	fleet         OutboxFleet
	fleetConsumer Consumer
	outbox        Outbox
	consumer      Consumer
	migrations    Migrations
	monitoring    Monitoring
	secret        awssecretsmanager.ISecret
}

func (s *sluiceStack) Outbox() Outbox                            { return s.outbox }
func (s *sluiceStack) Consumer() Consumer                        { return s.consumer }
func (s *sluiceStack) Migrations() Migrations                    { return s.migrations }
func (s *sluiceStack) Monitoring() Monitoring                    { return s.monitoring }
func (s *sluiceStack) DatabaseSecret() awssecretsmanager.ISecret { return s.secret }
func (s *sluiceStack) Fleet() OutboxFleet                        { return s.fleet }
func (s *sluiceStack) FleetConsumer() Consumer                   { return s.fleetConsumer }

// NewSluiceStack creates the example stack. It panics on invalid props.
func NewSluiceStack(scope constructs.Construct, id string, props *SluiceStackProps) SluiceStack {
	p := *props
	var errs []error
	if d := p.Database; d != nil {
		if d.SecretARN == "" {
			errs = append(errs, errors.New("Database.SecretARN is required to import a database"))
		}
		if d.Port < 0 || d.Port > 65535 {
			errs = append(errs, fmt.Errorf("Database.Port must be a TCP port, got %d", d.Port))
		}
	}
	if p.AlarmEmail == "" && p.AlarmTopicArn == "" && !p.NoAlarmDestination {
		errs = append(errs, errors.New("alarms need a destination: set -c alarmEmail=ADDRESS, -c alarmTopicArn=ARN (an existing topic), "+
			"or -c alarmDestination=none to deploy alarms that reach nobody"))
	}
	if p.InstanceType != nil && p.MaxConnections == 0 && p.Database == nil {
		errs = append(errs, errors.New("MaxConnections is required with a non-default InstanceType (the connection budget depends on it)"))
	}
	if p.NatGateways < 0 || p.NatGateways > 2 {
		errs = append(errs, fmt.Errorf("NatGateways must be 0, 1 or 2, got %d", p.NatGateways))
	}
	if p.MaxAllocatedStorageGB != 0 && (p.MaxAllocatedStorageGB < 20 || p.MaxAllocatedStorageGB > 65536) {
		errs = append(errs, fmt.Errorf("MaxAllocatedStorageGB must be between 20 and 65536, got %d", p.MaxAllocatedStorageGB))
	}
	if p.MaxAllocatedStorageGB != 0 && p.Database != nil {
		errs = append(errs, errors.New("MaxAllocatedStorageGB shapes the stack's own database: leave it unset with Database"))
	}
	if p.ConsumerProxy && p.Database != nil {
		errs = append(errs, errors.New("ConsumerProxy needs the stack's own database (a proxy targets an instance)"))
	}
	if d := p.Database; d != nil && d.InstanceIdentifier != "" && d.MaxConnections == 0 {
		errs = append(errs, errors.New("Database.InstanceIdentifier needs Database.MaxConnections (the connections alarm is a share of it)"))
	}
	if p.Fleet < 0 || p.Fleet > MaxExampleFleet {
		errs = append(errs, fmt.Errorf("Fleet must be between 0 and %d tenants, got %d", MaxExampleFleet, p.Fleet))
	}
	if p.Fleet > 0 && p.Database != nil {
		errs = append(errs, errors.New("Fleet puts its tenant databases on the stack's own database instance: leave Database unset"))
	}
	if p.FleetShards != 0 && p.Fleet == 0 {
		errs = append(errs, errors.New("FleetShards needs Fleet"))
	}
	errs = append(errs, checkExampleDestination(&p)...)
	invalid("SluiceStack", id, errs...)
	p.ConsumerName = orDefault(p.ConsumerName, "example")
	if p.InstanceType == nil && p.Database == nil {
		p.MaxConnections = orDefault(p.MaxConnections, DefaultMaxConnections)
	}

	s := &sluiceStack{}
	awscdk.NewStack_Override(s, scope, &id, &p.StackProps) // s itself is the jsii stack, so it can be passed to CDK APIs
	stack := s

	var network Network
	var endpoints *stackEndpoints
	if p.VpcID != "" {
		// An imported VPC keeps its own routes: the functions go in its private subnets with
		// egress and may use HTTPS to any address (its NAT or endpoints).
		network.Vpc = awsec2.Vpc_FromLookup(stack, jsii.String("Vpc"), &awsec2.VpcLookupOptions{VpcId: jsii.String(p.VpcID)})
	} else {
		network, endpoints = newNetwork(stack, p.NatGateways, exampleEndpoints(&p))
	}

	db := Database{CABundle: p.CABundle}
	var dbDeps []constructs.IConstruct
	var instance awsrds.IDatabaseInstance
	var ownInstance awsrds.DatabaseInstance // the stack's own, for an RDS Proxy
	maxConnections := p.MaxConnections
	if d := p.Database; d != nil {
		s.secret = awssecretsmanager.Secret_FromSecretAttributes(stack, jsii.String("DatabaseSecret"), &awssecretsmanager.SecretAttributes{
			SecretCompleteArn: jsii.String(d.SecretARN),
		})
		db.Secret = s.secret
		if d.SecurityGroupID != "" {
			sg := awsec2.SecurityGroup_FromSecurityGroupId(stack, jsii.String("DatabaseSecurityGroup"), jsii.String(d.SecurityGroupID), &awsec2.SecurityGroupImportOptions{
				AllowAllOutbound: jsii.Bool(false),
			})
			db.Connections = awsec2.NewConnections(&awsec2.ConnectionsProps{
				SecurityGroups: &[]awsec2.ISecurityGroup{sg},
				DefaultPort:    awsec2.Port_Tcp(jsii.Number(float64(orDefault(d.Port, 5432)))),
			})
		}
		maxConnections = d.MaxConnections
		if d.InstanceIdentifier != "" {
			// Only its metrics are used: the alarms' DBInstanceIdentifier dimension.
			instance = awsrds.DatabaseInstance_FromDatabaseInstanceAttributes(stack, jsii.String("Database"), &awsrds.DatabaseInstanceAttributes{
				InstanceIdentifier:      jsii.String(d.InstanceIdentifier),
				InstanceEndpointAddress: s.secret.SecretValueFromJson(jsii.String("host")).UnsafeUnwrap(),
				Port:                    jsii.Number(float64(orDefault(d.Port, 5432))),
				SecurityGroups:          &[]awsec2.ISecurityGroup{},
			})
		}
	} else {
		created, sg := newDatabase(stack, network, p)
		instance, ownInstance = created, created
		s.secret = created.Secret()
		db.Secret = s.secret
		db.Connections = created
		dbDeps = append(dbDeps, created, sg)
		awscdk.NewCfnOutput(stack, jsii.String("DatabaseEndpoint"), &awscdk.CfnOutputProps{
			Description: jsii.String("PostgreSQL endpoint (private; reachable from the Lambdas' security groups only)"),
			Value:       created.DbInstanceEndpointAddress(),
		})
	}

	s.migrations = NewMigrations(stack, "Migrations", &MigrationsProps{CodeDir: p.MigrateCodeDir, Network: network, Database: db,
		MaxConnections: maxConnections, OutboxRetention: p.OutboxRetention, InboxRetention: p.InboxRetention})
	for _, d := range dbDeps {
		s.migrations.Resource().Node().AddDependency(d)
	}
	dest := newExampleDestination(stack, network, &p)
	var claim ClaimCheck
	if p.ClaimCheck != nil {
		claim = NewClaimCheck(stack, "ClaimCheck", p.ClaimCheck)
	}
	relayService, relayImage := exampleRelayService(stack, p.RelayImageDir)
	if relayService != nil && p.WALWakeup {
		relayService.WALPublication = "sluice_outbox"
	}
	s.outbox = NewOutbox(stack, "Outbox", &OutboxProps{
		RelayCodeDir: p.RelayCodeDir,
		Network:      network,
		Database:     db,
		Migrations:   s.migrations,
		Fifo:         p.Fifo,
		Publishers:   p.Publishers,
		Relay:        p.Relay,

		// The example's destination, unless SNS, receives every row.
		DefaultDestination: dest,
		ClaimCheck:         claim,
		RelayService:       relayService,
	})
	consumerProps := &ConsumerProps{
		Name:       p.ConsumerName,
		CodeDir:    p.ConsumerCodeDir,
		Topic:      s.outbox.Topic(), // nil with dest: replaced below
		Fifo:       p.Fifo,
		Network:    network,
		Database:   db,
		Migrations: s.migrations,
		// The skeleton consumer (lambdas/consumer) writes nothing beyond its inbox rows. A
		// service's consumer declares the tables its handlers write in DatabaseGrants, e.g.
		// {Table: "invoice", Privileges: []string{"SELECT", "INSERT"}}.
		MaxConcurrency: p.ConsumerMaxConcurrency,
		CommitMode:     p.ConsumerCommitMode,
		DeadlineMargin: p.ConsumerDeadlineMargin,
		StorePayload:   p.ConsumerStorePayload,
		Redrivers:      p.Redrivers,
		// With NAT, the VPC routes to the internet for handler code that calls other services;
		// the relay and the migrations still reach only what they call.
		HTTPSToAnywhere: p.VpcID == "" && p.NatGateways > 0,
		ClaimCheck:      claim,
	}
	if dest != nil {
		consumerProps.Topic, consumerProps.Source = nil, dest
	}
	if p.ConsumerProxy {
		role := NewDatabaseRole(stack, "ConsumerDatabaseRole", &DatabaseRoleProps{
			Migrations: s.migrations, Name: roleName(p.ConsumerName), Kind: RoleConsumer, Consumer: p.ConsumerName,
			Grants: consumerProps.DatabaseGrants, Network: network, Database: db,
		})
		consumerProps.DatabaseRole, consumerProps.DatabaseGrants = role, nil
		consumerProps.Proxy, consumerProps.ProxyMaxConnectionsPercent = newConsumerProxy(stack, network, ownInstance, role)
	}
	s.consumer = NewConsumer(stack, "Consumer", consumerProps)
	consumers := []Consumer{s.consumer}
	if p.Fleet > 0 {
		s.fleet = newExampleFleet(stack, network, db, ownInstance, s.migrations, &p)
		// The example consumer's code and settings, on the fleet's topic and in its tenants'
		// databases, its connections booked beside the fleet's relays.
		s.fleetConsumer = NewConsumer(stack, "FleetConsumer", &ConsumerProps{
			Name:            p.ConsumerName + "-fleet",
			CodeDir:         p.ConsumerCodeDir,
			Topic:           s.fleet.Topic(),
			Fifo:            p.Fifo,
			Network:         network,
			Fleet:           &ConsumerFleet{Fleet: s.fleet},
			MaxConcurrency:  p.ConsumerMaxConcurrency,
			CommitMode:      p.ConsumerCommitMode,
			DeadlineMargin:  p.ConsumerDeadlineMargin,
			StorePayload:    p.ConsumerStorePayload,
			Redrivers:       p.Redrivers,
			HTTPSToAnywhere: consumerProps.HTTPSToAnywhere,
		})
		consumers = append(consumers, s.fleetConsumer)
	}

	mon := &MonitoringProps{
		Fleet:              s.fleet,
		Outbox:             s.outbox,
		Consumers:          consumers,
		Migrations:         s.migrations,
		AlarmEmail:         p.AlarmEmail,
		NoAlarmDestination: p.NoAlarmDestination,
	}
	if p.AlarmTopicArn != "" {
		mon.AlarmTopic = awssns.Topic_FromTopicArn(stack, jsii.String("AlarmTopic"), jsii.String(p.AlarmTopicArn))
	}
	if instance != nil {
		mon.Database = &DatabaseAlarms{Instance: instance, MaxConnections: maxConnections}
		if p.WALWakeup {
			mon.Database.ReplicationSlotLagBytes = walKeepMB << 20 / 4
		}
	}
	s.monitoring = NewMonitoring(stack, "Monitoring", mon)
	if endpoints != nil {
		var topics []*string
		if t := s.outbox.Topic(); t != nil {
			topics = append(topics, t.TopicArn())
		}
		if s.fleet != nil && s.fleet.Topic() != nil {
			topics = append(topics, s.fleet.Topic().TopicArn())
		}
		callers := endpointCallers{topics: topics, destination: dest}
		if claim != nil {
			callers.bucket = claim.Bucket()
		}
		if p.Database != nil {
			callers.importedSecret = s.secret.SecretArn()
		}
		if relayImage != nil {
			callers.relayRepository = relayImage.Repository().RepositoryArn()
			callers.relayLogs = s.outbox.(*outbox).serviceLogs.LogGroupArn()
		}
		if dest != nil && dest.Kind() == sluiceoutbox.Kafka {
			callers.mskConsumer = s.consumer.Function()
		}
		endpoints.scope(stack, callers)
	}

	out := func(name, description string, value *string) {
		awscdk.NewCfnOutput(stack, jsii.String(name), &awscdk.CfnOutputProps{Description: jsii.String(description), Value: value})
	}
	if t := s.outbox.Topic(); t != nil {
		out("TopicArn", "SNS topic the relay publishes to", t.TopicArn())
	}
	if dest != nil {
		exampleDestinationOutputs(out, dest)
	}
	if fn := s.outbox.Relay(); fn != nil {
		out("RelayFunctionName", "Relay Lambda", fn.FunctionName())
	} else {
		out("RelayServiceName", "Relay Fargate service", s.outbox.RelayService().ServiceName())
	}
	if q := s.consumer.Queue(); q != nil {
		out("ConsumerQueueUrl", "Consumer queue", q.QueueUrl())
	}
	out("ConsumerDeadLetterQueueUrl", "Consumer DLQ (sluice redrive --dlq URL; a stream consumer's failure records)", s.consumer.DeadLetterQueue().QueueUrl())
	if q := s.consumer.SubscriptionDeadLetterQueue(); q != nil {
		out("SubscriptionDeadLetterQueueUrl", "Subscription DLQ: messages SNS or the EventBridge rule could not deliver (sluice redrive --dlq URL)", q.QueueUrl())
	}
	out("ConsumerFunctionName", "Consumer Lambda", s.consumer.Function().FunctionName())
	out("DatabaseSecretArn", "Secrets Manager secret with the database credentials (DATABASE_SECRET_ARN)", s.secret.SecretArn())
	out("AlarmTopicArn", "SNS topic receiving the alarms", s.monitoring.AlarmTopic().TopicArn())
	out("DashboardName", "CloudWatch dashboard", s.monitoring.Dashboard().DashboardName())
	if claim != nil {
		out("ClaimCheckBucket", "S3 bucket of the claim check's payloads", claim.Bucket().BucketName())
	}
	if f := s.fleet; f != nil {
		out("FleetTopicArn", "SNS topic the fleet's relays publish to", f.Topic().TopicArn())
		for i, fn := range f.Relays() {
			out(fmt.Sprintf("FleetShard%dFunctionName", i), fmt.Sprintf("Fleet relay Lambda of shard %d", i), fn.FunctionName())
		}
		c := s.fleetConsumer
		out("FleetConsumerQueueUrl", "Fleet consumer queue", c.Queue().QueueUrl())
		out("FleetConsumerDeadLetterQueueUrl", "Fleet consumer DLQ (sluice redrive --dlq URL)", c.DeadLetterQueue().QueueUrl())
		out("FleetConsumerFunctionName", "Fleet consumer Lambda", c.Function().FunctionName())
	}
	return s
}

// exampleFleetServer is the example fleet's name for the stack's database instance.
const exampleFleetServer = "example"

// newExampleFleet adds SluiceStackProps.Fleet tenant databases on the stack's own instance
// and the OutboxFleet serving them. Each tenant's secret (role sluice_tenant_I, database
// tenant_I, a generated password) is attached to the instance for its host and port; the
// operator creates the role and the database with that password and migrates it (sluice
// migrate), after which the fleet serves it. The fleet books its relays on the migrations'
// budget: one instance, one max_connections.
func newExampleFleet(stack awscdk.Stack, network Network, db Database, instance awsrds.DatabaseInstance, mig Migrations, p *SluiceStackProps) OutboxFleet {
	tenants := make([]FleetTenant, p.Fleet)
	for i := range tenants {
		n := i + 1
		secret := awsrds.NewDatabaseSecret(stack, jsii.String(fmt.Sprintf("FleetTenant%dSecret", n)), &awsrds.DatabaseSecretProps{
			Username: jsii.String(fmt.Sprintf("sluice_tenant_%d", n)),
			Dbname:   jsii.String(fmt.Sprintf("tenant_%d", n)),
		})
		suppress(secret, "AwsSolutions-SMG4",
			"The example's tenant secrets hold the passwords of roles the operator creates after the deploy (docs/deploy.md, Deploying a fleet): "+
				"a rotation scheduled before the role exists would fail. A production fleet's tenant secrets come with its tenant databases, rotated there.")
		tenants[i] = FleetTenant{Name: fmt.Sprintf("tenant-%d", n), Secret: secret.Attach(instance), Server: exampleFleetServer}
	}
	return NewOutboxFleet(stack, "Fleet", &OutboxFleetProps{
		OutboxProps: OutboxProps{
			RelayCodeDir: p.RelayCodeDir,
			Network:      network,
			Database:     Database{CABundle: db.CABundle, SSLMode: db.SSLMode},
			Fifo:         p.Fifo,
			Relay:        p.Relay,
		},
		Tenants: tenants,
		Servers: []FleetServer{{Name: exampleFleetServer, Budget: mig, RelayConnections: ExampleFleetRelayConnections, Connections: instance}},
		Shards:  p.FleetShards,
	})
}

// newNetwork creates the VPC: isolated subnets for the database, private subnets for the
// functions (isolated too without NAT), and the interface endpoints (by id) the functions and
// tasks call AWS through, with the S3 gateway endpoint; stackEndpoints.scope writes their
// policies once the stack's resources exist.
func newNetwork(stack awscdk.Stack, natGateways int, interfaces map[string]awsec2.InterfaceVpcEndpointAwsService) (Network, *stackEndpoints) {
	lambdaSubnets := awsec2.SubnetType_PRIVATE_ISOLATED
	subnets := []*awsec2.SubnetConfiguration{}
	if natGateways > 0 {
		lambdaSubnets = awsec2.SubnetType_PRIVATE_WITH_EGRESS
		subnets = append(subnets, &awsec2.SubnetConfiguration{Name: jsii.String("public"), SubnetType: awsec2.SubnetType_PUBLIC, CidrMask: jsii.Number(24)})
	}
	subnets = append(subnets,
		&awsec2.SubnetConfiguration{Name: jsii.String("lambdas"), SubnetType: lambdaSubnets, CidrMask: jsii.Number(22)},
		&awsec2.SubnetConfiguration{Name: jsii.String("database"), SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED, CidrMask: jsii.Number(24)})
	vpc := awsec2.NewVpc(stack, jsii.String("Vpc"), &awsec2.VpcProps{
		MaxAzs:              jsii.Number(2),
		NatGateways:         jsii.Number(float64(natGateways)),
		SubnetConfiguration: &subnets,
		FlowLogs: &map[string]*awsec2.FlowLogOptions{
			"FlowLogs": {TrafficType: awsec2.FlowLogTrafficType_REJECT},
		},
	})
	lambdas := &awsec2.SubnetSelection{SubnetGroupName: jsii.String("lambdas")}
	endpointSG := awsec2.NewSecurityGroup(stack, jsii.String("EndpointSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              vpc,
		Description:      jsii.String("sluice interface VPC endpoints: HTTPS in from the sluice functions only"),
		AllowAllOutbound: jsii.Bool(false),
	})
	eps := &stackEndpoints{interfaces: map[string]awsec2.InterfaceVpcEndpoint{}}
	for _, id := range sortedKeys(interfaces) {
		eps.interfaces[id] = vpc.AddInterfaceEndpoint(jsii.String(id), &awsec2.InterfaceVpcEndpointOptions{
			Service:           interfaces[id],
			Subnets:           lambdas,
			PrivateDnsEnabled: jsii.Bool(true),
			Open:              jsii.Bool(false),
			SecurityGroups:    &[]awsec2.ISecurityGroup{endpointSG},
		})
	}
	// CloudFormation's custom resource response is a presigned S3 URL (the migrations), the
	// claim check's payloads are S3 objects, and ECR serves image layers from S3.
	eps.s3 = vpc.AddGatewayEndpoint(jsii.String("S3Endpoint"), &awsec2.GatewayVpcEndpointOptions{
		Service: awsec2.GatewayVpcEndpointAwsService_S3(),
		Subnets: &[]*awsec2.SubnetSelection{lambdas},
	})
	return Network{Vpc: vpc, Subnets: lambdas, ApiEndpoints: endpointSG, S3PrefixList: s3PrefixList(stack)}, eps
}

// s3PrefixList looks up the ID of the region's AWS-managed S3 prefix list
// (com.amazonaws.REGION.s3) at deploy time, so that the functions' egress to S3 names it while
// the template stays region-agnostic (CloudFormation's VPC endpoint has no attribute for it).
func s3PrefixList(stack awscdk.Stack) *string {
	name := awscdk.Fn_Join(jsii.String(""), &[]*string{jsii.String("com.amazonaws."), awscdk.Aws_REGION(), jsii.String(".s3")})
	lookup := &customresources.AwsSdkCall{
		Service: jsii.String("EC2"), Action: jsii.String("describeManagedPrefixLists"),
		Parameters:         map[string]any{"Filters": []any{map[string]any{"Name": "prefix-list-name", "Values": []any{name}}}},
		PhysicalResourceId: customresources.PhysicalResourceId_Of(name),
		OutputPaths:        jsii.Strings("PrefixLists.0.PrefixListId"),
	}
	cr := customresources.NewAwsCustomResource(stack, jsii.String("S3PrefixList"), &customresources.AwsCustomResourceProps{
		OnCreate: lookup, OnUpdate: lookup,
		// DescribeManagedPrefixLists has no resource-level permissions: Resource "*" (read-only).
		Policy:              customresources.AwsCustomResourcePolicy_FromSdkCalls(&customresources.SdkCallsPolicyOptions{Resources: customresources.AwsCustomResourcePolicy_ANY_RESOURCE()}),
		InstallLatestAwsSdk: jsii.Bool(false),
	})
	suppress(cr, "AwsSolutions-IAM5",
		"ec2:DescribeManagedPrefixLists (read-only, the one action of this policy) supports no resource-level permissions: "+
			"the lookup of the region's S3 prefix list needs Resource *.", "Resource::*")
	suppressAwsCustomResource(stack)
	return cr.GetResponseField(jsii.String("PrefixLists.0.PrefixListId"))
}

// The example VPC's interface endpoints, by construct id (exampleEndpoints).
const (
	secretsManagerEndpoint = "SecretsManagerEndpoint"
	snsEndpoint            = "SnsEndpoint"
	eventBridgeEndpoint    = "EventBridgeEndpoint"
	kinesisEndpoint        = "KinesisEndpoint"
	lambdaEndpoint         = "LambdaEndpoint"
	stsEndpoint            = "StsEndpoint"
	ecrAPIEndpoint         = "EcrApiEndpoint"
	ecrDockerEndpoint      = "EcrDockerEndpoint"
	logsEndpoint           = "LogsEndpoint"
)

// stackEndpoints are the example VPC's endpoints whose policies the stack scopes to its own
// resources.
type stackEndpoints struct {
	s3         awsec2.GatewayVpcEndpoint
	interfaces map[string]awsec2.InterfaceVpcEndpoint
}

// endpointCallers are what the stack's hosts call through the endpoints: each endpoint's
// policy names these resources only.
type endpointCallers struct {
	// topics are the SNS topics the relays publish to.
	topics []*string
	// destination is the example's destination other than SNS; nil for SNS.
	destination Destination
	// bucket is the claim check's bucket; nil without.
	bucket awss3.IBucket
	// importedSecret is an imported database's secret; nil for the stack's own.
	importedSecret *string
	// relayRepository and relayLogs are the Fargate relay's image repository and log group;
	// nil for the relay Lambda.
	relayRepository, relayLogs *string
	// mskConsumer is the consumer an MSK mapping's pollers invoke; nil without MSK.
	mskConsumer awslambda.IFunction
}

// ecrLayerBucket is ECR's bucket of image layers in the stack's region, which Fargate pulls
// through the S3 gateway endpoint (AWS documents the name for private subnets).
func ecrLayerBucket() *string {
	return awscdk.Fn_Join(jsii.String(""), &[]*string{
		jsii.String("arn:"), awscdk.Aws_PARTITION(), jsii.String(":s3:::prod-"), awscdk.Aws_REGION(), jsii.String("-starport-layer-bucket/*"),
	})
}

// scope writes the endpoint policies: each endpoint lets through only the calls the stack's
// hosts make, on the stack's resources (callers). Through the S3 gateway endpoint
// CloudFormation's custom resource responses, the claim check's objects (and listing its
// bucket, so that a missing payload reads 404) and ECR's layers; through Secrets Manager the
// stack's secrets; through SNS publishing to the relays' topics; through EventBridge and
// Kinesis putting on the destination; through Lambda and STS the MSK mapping's invoking and
// assuming the consumer's role; through ECR pulling the relay's image; through CloudWatch
// Logs the relay tasks' log streams. Code in the VPC cannot use an endpoint to reach anything
// else, whatever its role allows. Call it after every resource of the stack exists; it panics
// on an interface endpoint it has no policy for (an endpoint without a policy allows all).
func (e *stackEndpoints) scope(stack awscdk.Stack, c endpointCallers) {
	allow := func(ep interface {
		AddToPolicy(awsiam.PolicyStatement)
	}, sid string, resources []*string, actions ...string) {
		ep.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid: jsii.String(sid), Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()}, Actions: jsii.Strings(actions...), Resources: &resources,
		}))
	}
	// The region without dashes, as the response bucket's name spells it (us-east-1 → useast1).
	region := awscdk.Fn_Join(jsii.String(""), awscdk.Fn_Split(jsii.String("-"), awscdk.Aws_REGION(), nil))
	responses := awscdk.Fn_Join(jsii.String(""), &[]*string{
		jsii.String("arn:"), awscdk.Aws_PARTITION(), jsii.String(":s3:::cloudformation-custom-resource-response-"), region, jsii.String("/*"),
	})
	allow(e.s3, "CloudFormationResponses", []*string{responses}, "s3:PutObject")
	if c.bucket != nil {
		allow(e.s3, "ClaimCheckObjects", []*string{c.bucket.ArnForObjects(jsii.String("*"))}, "s3:PutObject", "s3:GetObject")
		// S3 answers 404 for a missing key only to a caller that may list the bucket.
		allow(e.s3, "ClaimCheckMissingPayloads", []*string{c.bucket.BucketArn()}, "s3:ListBucket")
	}
	if c.relayRepository != nil {
		allow(e.s3, "EcrImageLayers", []*string{ecrLayerBucket()}, "s3:GetObject")
	}

	scoped := map[string]bool{}
	for id, ep := range e.interfaces {
		switch id {
		case secretsManagerEndpoint:
			var secrets []*string
			for _, n := range *stack.Node().FindAll(constructs.ConstructOrder_PREORDER) {
				if r, ok := n.(awscdk.CfnResource); ok && *awscdk.CfnResource_IsCfnResource(n) && *r.CfnResourceType() == "AWS::SecretsManager::Secret" {
					secrets = append(secrets, r.Ref())
				}
			}
			if c.importedSecret != nil {
				secrets = append(secrets, c.importedSecret)
			}
			allow(ep, "TheStacksSecrets", secrets,
				"secretsmanager:GetSecretValue", "secretsmanager:PutSecretValue", "secretsmanager:DescribeSecret", "secretsmanager:UpdateSecretVersionStage")
			allow(ep, "RotationPasswords", []*string{jsii.String("*")}, "secretsmanager:GetRandomPassword")
		case snsEndpoint:
			if len(c.topics) == 0 {
				continue
			}
			allow(ep, "TheOutboxTopics", c.topics, "sns:Publish")
		case eventBridgeEndpoint:
			allow(ep, "TheDestinationBus", []*string{c.destination.Address()}, "events:PutEvents")
		case kinesisEndpoint:
			allow(ep, "TheDestinationStream", []*string{c.destination.Address()}, "kinesis:PutRecords")
		case lambdaEndpoint:
			// The MSK mapping's pollers invoke the consumer (and its versions).
			fn := c.mskConsumer.FunctionArn()
			allow(ep, "TheMappingInvokesTheConsumer", []*string{fn, awscdk.Fn_Join(jsii.String(""), &[]*string{fn, jsii.String(":*")})}, "lambda:InvokeFunction")
		case stsEndpoint:
			// ... as the consumer's execution role, which they assume.
			allow(ep, "TheMappingAssumesTheConsumersRole", []*string{c.mskConsumer.Role().RoleArn()}, "sts:AssumeRole")
		case ecrAPIEndpoint, ecrDockerEndpoint:
			// Fargate pulls the relay's image with the task execution role: a token (no
			// resource), then the image's manifest and layer locations.
			allow(ep, "PullToken", []*string{jsii.String("*")}, "ecr:GetAuthorizationToken")
			allow(ep, "PullTheRelayImage", []*string{c.relayRepository},
				"ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage")
		case logsEndpoint:
			// The awslogs driver writes the relay tasks' streams (the EMF metrics among them).
			allow(ep, "TheRelayTasksLogs", []*string{c.relayLogs}, "logs:CreateLogStream", "logs:PutLogEvents")
		default:
			continue
		}
		scoped[id] = true
	}
	var open []string
	for _, id := range sortedKeys(e.interfaces) {
		if !scoped[id] {
			open = append(open, id)
		}
	}
	if len(open) > 0 {
		panic(fmt.Errorf("sluice: interface endpoints without a policy (they would allow every call): %s", strings.Join(open, ", ")))
	}
}

// newConsumerProxy creates an RDS Proxy for the consumer role (TLS required, its secret only)
// and returns it with its share of the database's connections (the consumer books it).
func newConsumerProxy(stack awscdk.Stack, network Network, instance awsrds.DatabaseInstance, role DatabaseRole) (awsrds.DatabaseProxy, int) {
	const percent = 25
	sg := awsec2.NewSecurityGroup(stack, jsii.String("ConsumerProxySecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              network.Vpc,
		Description:      jsii.String("sluice consumer RDS Proxy: in from the consumer, out to the database"),
		AllowAllOutbound: jsii.Bool(false),
	})
	// A name unique to this stack (CDK would name it "ConsumerProxy", its id, and a second stack
	// in the account and region would fail to deploy): the stack and construct path with a hash.
	name := awscdk.Names_UniqueResourceName(sg, &awscdk.UniqueResourceNameOptions{MaxLength: jsii.Number(60), Separator: jsii.String("-")})
	name = jsii.String(strings.Replace(*name, "SecurityGroup", "", 1))
	proxy := awsrds.NewDatabaseProxy(stack, jsii.String("ConsumerProxy"), &awsrds.DatabaseProxyProps{
		DbProxyName:           name,
		ProxyTarget:           awsrds.ProxyTarget_FromInstance(instance),
		Secrets:               &[]awssecretsmanager.ISecret{role.Secret()},
		Vpc:                   network.Vpc,
		VpcSubnets:            &awsec2.SubnetSelection{SubnetGroupName: jsii.String("database")},
		SecurityGroups:        &[]awsec2.ISecurityGroup{sg},
		RequireTLS:            jsii.Bool(true),
		MaxConnectionsPercent: jsii.Number(percent),
		// The relay holds row locks in long transactions and never comes here; the consumer's
		// transactions are short, so a borrowed connection returns quickly.
		BorrowTimeout: awscdk.Duration_Seconds(jsii.Number(30)),
	})
	instance.Connections().AllowDefaultPortFrom(sg, jsii.String("sluice consumer RDS Proxy to PostgreSQL"))
	return proxy, percent
}

func newDatabase(stack awscdk.Stack, network Network, p SluiceStackProps) (awsrds.DatabaseInstance, awsec2.SecurityGroup) {
	vpc := network.Vpc
	dbSubnets := &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED}
	if network.ApiEndpoints != nil { // the stack's own VPC
		dbSubnets = &awsec2.SubnetSelection{SubnetGroupName: jsii.String("database")}
	}
	engine := awsrds.DatabaseInstanceEngine_Postgres(&awsrds.PostgresInstanceEngineProps{Version: awsrds.PostgresEngineVersion_VER_17_9()})
	parameters := map[string]*string{
		"rds.force_ssl":   jsii.String("1"),
		"max_connections": jsii.String(fmt.Sprint(p.MaxConnections)),
	}
	if p.WALWakeup {
		// The relay follows the WAL (docs/outbox.md, "WAL wake-up"): logical decoding, and a
		// bound on what any replication slot may hold back (MB), so that none fills the disk.
		parameters["rds.logical_replication"] = jsii.String("1")
		parameters["max_slot_wal_keep_size"] = jsii.String(fmt.Sprint(walKeepMB))
	}
	params := awsrds.NewParameterGroup(stack, jsii.String("DatabaseParameters"), &awsrds.ParameterGroupProps{
		Engine:      engine,
		Description: jsii.String("sluice: TLS required for every connection; max_connections fixed for the connection budget"),
		Parameters:  &parameters,
	})
	sg := awsec2.NewSecurityGroup(stack, jsii.String("DatabaseSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              vpc,
		Description:      jsii.String("sluice PostgreSQL: inbound only from the sluice Lambdas"),
		AllowAllOutbound: jsii.Bool(false),
	})
	instanceType := p.InstanceType
	if instanceType == nil {
		instanceType = awsec2.InstanceType_Of(awsec2.InstanceClass_BURSTABLE4_GRAVITON, awsec2.InstanceSize_SMALL)
	}
	multiAZ := true
	if p.MultiAZ != nil {
		multiAZ = *p.MultiAZ
	}
	db := awsrds.NewDatabaseInstance(stack, jsii.String("Database"), &awsrds.DatabaseInstanceProps{
		Engine:                  engine,
		InstanceType:            instanceType,
		Vpc:                     vpc,
		VpcSubnets:              dbSubnets,
		SecurityGroups:          &[]awsec2.ISecurityGroup{sg},
		Credentials:             awsrds.Credentials_FromGeneratedSecret(jsii.String("sluice"), nil),
		DatabaseName:            jsii.String("sluice"),
		ParameterGroup:          params,
		StorageEncrypted:        jsii.Bool(true),
		PubliclyAccessible:      jsii.Bool(false),
		MultiAz:                 jsii.Bool(multiAZ),
		AllocatedStorage:        jsii.Number(20),
		StorageType:             awsrds.StorageType_GP3,
		MaxAllocatedStorage:     jsii.Number(float64(orDefault(p.MaxAllocatedStorageGB, 200))),
		BackupRetention:         awscdk.Duration_Days(jsii.Number(7)),
		DeletionProtection:      jsii.Bool(true),
		RemovalPolicy:           awscdk.RemovalPolicy_SNAPSHOT,
		CloudwatchLogsExports:   jsii.Strings("postgresql"),
		AutoMinorVersionUpgrade: jsii.Bool(true),
	})
	suppress(db, "AwsSolutions-RDS11",
		"PostgreSQL keeps its standard port: the instance is in isolated subnets and its security group admits "+
			"only the sluice Lambdas' security groups, so a non-default port adds no protection, only client configuration.")
	// The master secret outlives the stack (like the snapshot the instance leaves), and rotates:
	// the migrations read it on every event, and no other function uses it.
	secret := db.Secret() // the attachment (host, port ...) of the generated secret, child "Secret"
	generated := db.Node().FindChild(jsii.String("Secret"))
	generated.Node().DefaultChild().(awscdk.CfnResource).ApplyRemovalPolicy(awscdk.RemovalPolicy_RETAIN, nil)
	rotateSecret(stack, secret, network, Database{Connections: db}, 30, nil)
	return db, sg
}

// walKeepMB is the example database's max_slot_wal_keep_size with WALWakeup: the most WAL a
// replication slot may hold back before PostgreSQL invalidates it (the relay then falls back to
// polling and creates a new slot). Its alarm fires at a quarter of it.
const walKeepMB = 4096

// exampleRelayService is the example stack's Fargate relay from the image built in dir, and
// that image (whose repository the ECR endpoints admit); nil, nil for "".
func exampleRelayService(stack awscdk.Stack, dir string) (*RelayServiceProps, awsecrassets.DockerImageAsset) {
	if dir == "" {
		return nil, nil
	}
	image := awsecrassets.NewDockerImageAsset(stack, jsii.String("RelayImage"), &awsecrassets.DockerImageAssetProps{
		Directory: jsii.String(dir),
		Platform:  awsecrassets.Platform_LINUX_ARM64(),
	})
	return &RelayServiceProps{Image: awsecs.ContainerImage_FromDockerImageAsset(image)}, image
}
