package infra

import (
	"errors"
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsrds"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
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
}

// SluiceStackProps configure the example stack.
type SluiceStackProps struct {
	awscdk.StackProps
	// RelayCodeDir, ConsumerCodeDir and MigrateCodeDir are directories holding the Lambdas'
	// `bootstrap` files (bin/relay, bin/consumer, bin/migrate after `make build`). Required.
	RelayCodeDir, ConsumerCodeDir, MigrateCodeDir string

	// VpcID imports an existing VPC (looked up at synth time; needs an account and region in
	// StackProps.Env). It must have private subnets with egress. Defaults to a new VPC.
	VpcID string
	// Database imports an existing database. Defaults to a new RDS PostgreSQL instance.
	Database *ExistingDatabase
	// MultiAZ makes the new database Multi-AZ. Defaults to true.
	MultiAZ *bool
	// InstanceType is the new database's instance type. Defaults to t4g.small.
	InstanceType awsec2.InstanceType

	// Fifo makes the topic and the consumer's queues FIFO. Defaults to standard.
	Fifo bool
	// ConsumerName is the example consumer's inbox name. Defaults to "example".
	ConsumerName string
	// AlarmEmail, when set, receives the alarm notifications.
	AlarmEmail string
}

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
}

type sluiceStack struct {
	awscdk.Stack
	outbox     Outbox
	consumer   Consumer
	migrations Migrations
	monitoring Monitoring
	secret     awssecretsmanager.ISecret
}

func (s *sluiceStack) Outbox() Outbox                            { return s.outbox }
func (s *sluiceStack) Consumer() Consumer                        { return s.consumer }
func (s *sluiceStack) Migrations() Migrations                    { return s.migrations }
func (s *sluiceStack) Monitoring() Monitoring                    { return s.monitoring }
func (s *sluiceStack) DatabaseSecret() awssecretsmanager.ISecret { return s.secret }

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
	invalid("SluiceStack", id, errs...)
	p.ConsumerName = orDefault(p.ConsumerName, "example")

	s := &sluiceStack{}
	awscdk.NewStack_Override(s, scope, &id, &p.StackProps) // s itself is the jsii stack, so it can be passed to CDK APIs
	stack := s

	var vpc awsec2.IVpc
	if p.VpcID != "" {
		vpc = awsec2.Vpc_FromLookup(stack, jsii.String("Vpc"), &awsec2.VpcLookupOptions{VpcId: jsii.String(p.VpcID)})
	} else {
		vpc = newVpc(stack)
	}

	var db Database
	var dbDeps []constructs.IConstruct
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
	} else {
		instance, sg := newDatabase(stack, vpc, p)
		s.secret = instance.Secret()
		db.Secret = s.secret
		db.Connections = instance
		dbDeps = append(dbDeps, instance, sg)
		awscdk.NewCfnOutput(stack, jsii.String("DatabaseEndpoint"), &awscdk.CfnOutputProps{
			Description: jsii.String("PostgreSQL endpoint (private; reachable from the Lambdas' security groups only)"),
			Value:       instance.DbInstanceEndpointAddress(),
		})
	}
	network := Network{Vpc: vpc}

	s.migrations = NewMigrations(stack, "Migrations", &MigrationsProps{CodeDir: p.MigrateCodeDir, Network: network, Database: db})
	for _, d := range dbDeps {
		s.migrations.Resource().Node().AddDependency(d)
	}
	s.outbox = NewOutbox(stack, "Outbox", &OutboxProps{
		RelayCodeDir: p.RelayCodeDir,
		Network:      network,
		Database:     db,
		Fifo:         p.Fifo,
	})
	s.consumer = NewConsumer(stack, "Consumer", &ConsumerProps{
		Name:     p.ConsumerName,
		CodeDir:  p.ConsumerCodeDir,
		Topic:    s.outbox.Topic(),
		Fifo:     p.Fifo,
		Network:  network,
		Database: db,
	})
	// Nothing reads or writes the tables before the migrations ran.
	s.outbox.Relay().Node().AddDependency(s.migrations.Resource())
	s.consumer.Function().Node().AddDependency(s.migrations.Resource())

	s.monitoring = NewMonitoring(stack, "Monitoring", &MonitoringProps{
		Outbox:     s.outbox,
		Consumers:  []Consumer{s.consumer},
		AlarmEmail: p.AlarmEmail,
	})

	out := func(name, description string, value *string) {
		awscdk.NewCfnOutput(stack, jsii.String(name), &awscdk.CfnOutputProps{Description: jsii.String(description), Value: value})
	}
	out("TopicArn", "SNS topic the relay publishes to", s.outbox.Topic().TopicArn())
	out("RelayFunctionName", "Relay Lambda", s.outbox.Relay().FunctionName())
	out("ConsumerQueueUrl", "Consumer queue", s.consumer.Queue().QueueUrl())
	out("ConsumerDeadLetterQueueUrl", "Consumer DLQ (sluice redrive --dlq URL)", s.consumer.DeadLetterQueue().QueueUrl())
	out("SubscriptionDeadLetterQueueUrl", "Subscription DLQ: messages SNS could not deliver (sluice redrive --dlq URL)", s.consumer.SubscriptionDeadLetterQueue().QueueUrl())
	out("ConsumerFunctionName", "Consumer Lambda", s.consumer.Function().FunctionName())
	out("DatabaseSecretArn", "Secrets Manager secret with the database credentials (DATABASE_SECRET_ARN)", s.secret.SecretArn())
	out("AlarmTopicArn", "SNS topic receiving the alarms", s.monitoring.AlarmTopic().TopicArn())
	out("DashboardName", "CloudWatch dashboard", s.monitoring.Dashboard().DashboardName())
	return s
}

func newVpc(stack awscdk.Stack) awsec2.IVpc {
	return awsec2.NewVpc(stack, jsii.String("Vpc"), &awsec2.VpcProps{
		MaxAzs:      jsii.Number(2),
		NatGateways: jsii.Number(1),
		SubnetConfiguration: &[]*awsec2.SubnetConfiguration{
			{Name: jsii.String("public"), SubnetType: awsec2.SubnetType_PUBLIC, CidrMask: jsii.Number(24)},
			{Name: jsii.String("lambdas"), SubnetType: awsec2.SubnetType_PRIVATE_WITH_EGRESS, CidrMask: jsii.Number(22)},
			{Name: jsii.String("database"), SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED, CidrMask: jsii.Number(24)},
		},
		FlowLogs: &map[string]*awsec2.FlowLogOptions{
			"FlowLogs": {TrafficType: awsec2.FlowLogTrafficType_REJECT},
		},
	})
}

func newDatabase(stack awscdk.Stack, vpc awsec2.IVpc, p SluiceStackProps) (awsrds.DatabaseInstance, awsec2.SecurityGroup) {
	engine := awsrds.DatabaseInstanceEngine_Postgres(&awsrds.PostgresInstanceEngineProps{Version: awsrds.PostgresEngineVersion_VER_17()})
	params := awsrds.NewParameterGroup(stack, jsii.String("DatabaseParameters"), &awsrds.ParameterGroupProps{
		Engine:      engine,
		Description: jsii.String("sluice: TLS required for every connection"),
		Parameters:  &map[string]*string{"rds.force_ssl": jsii.String("1")},
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
		VpcSubnets:              &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_ISOLATED},
		SecurityGroups:          &[]awsec2.ISecurityGroup{sg},
		Credentials:             awsrds.Credentials_FromGeneratedSecret(jsii.String("sluice"), nil),
		DatabaseName:            jsii.String("sluice"),
		ParameterGroup:          params,
		StorageEncrypted:        jsii.Bool(true),
		PubliclyAccessible:      jsii.Bool(false),
		MultiAz:                 jsii.Bool(multiAZ),
		AllocatedStorage:        jsii.Number(20),
		MaxAllocatedStorage:     jsii.Number(200),
		BackupRetention:         awscdk.Duration_Days(jsii.Number(7)),
		DeletionProtection:      jsii.Bool(true),
		RemovalPolicy:           awscdk.RemovalPolicy_SNAPSHOT,
		CloudwatchLogsExports:   jsii.Strings("postgresql"),
		AutoMinorVersionUpgrade: jsii.Bool(true),
	})
	suppress(db, "AwsSolutions-RDS11",
		"PostgreSQL keeps its standard port: the instance is in isolated subnets and its security group admits "+
			"only the sluice Lambdas' security groups, so a non-default port adds no protection, only client configuration.")
	suppress(db, "AwsSolutions-SMG4",
		"The Lambdas read the credentials once per cold start (the design decision of the Lambdas issue), so an automatic "+
			"rotation would make warm instances fail to open new connections until they are recycled. Rotate deliberately: "+
			"rotate the secret, then publish new versions of the functions (docs/deploy.md).")
	return db, sg
}
