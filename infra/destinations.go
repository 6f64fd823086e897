package infra

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskinesis"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsmsk"
	"github.com/aws/aws-cdk-go/awscdk/v2/customresources"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	sluiceoutbox "github.com/sluicehq/sluice/pkg/outbox"
)

// Destination is a broker other than SNS that the relay publishes logical topics to: an
// EventBridge bus (NewEventBridgeDestination), a Kinesis data stream (NewKinesisDestination) or
// a Kafka topic on Amazon MSK (NewMskDestination). Route logical topics to it with
// OutboxProps.Destinations: the relay gets the permissions, settings and network access it
// needs. Subscribe a consumer to it with ConsumerProps.Source. What ordering and deduplication
// each gives downstream: docs/destinations.md.
type Destination interface {
	constructs.IConstruct
	// Kind is the broker: outbox.EventBridge, outbox.Kinesis or outbox.Kafka.
	Kind() sluiceoutbox.Kind
	// Address is what the relay publishes to, its SLUICE_TOPIC_ARNS value: the bus ARN, the
	// stream ARN, or kafka://TOPIC.
	Address() *string
	// bindRelay gives relay what publishing here needs: IAM, environment, network.
	bindRelay(relay relayHost)
}

// EventBridgeDestinationProps configure an EventBridge bus as a relay destination.
type EventBridgeDestinationProps struct {
	// Bus is an existing event bus to publish to. Defaults to a new bus.
	Bus awsevents.IEventBus
	// BusName is the new bus's name. Defaults to a generated name. Not with Bus.
	BusName string
	// Source is the Source of every event the relay puts (SLUICE_EVENTBRIDGE_SOURCE), which
	// consumers' rules match. Every EventBridge destination of one outbox has the same (the
	// relay has one setting). Defaults to outbox.DefaultEventSource ("sluice").
	Source string
	// Publishers are further IAM principal ARNs (roles) allowed to put events on a new bus, e.g.
	// an operator role that runs `sluice relay` or `sluice replay`. The bus policy denies
	// events:PutEvents to every other principal but the relay's role (set when an outbox binds
	// the bus), so that nobody forges an event the consumers would apply. An imported bus keeps
	// its own policy. Defaults to none.
	Publishers []string
}

// EventBridgeDestination is an EventBridge bus the relay puts events on.
type EventBridgeDestination interface {
	Destination
	// Bus is the event bus.
	Bus() awsevents.IEventBus
	// Source is the events' Source.
	Source() string
}

type eventBridgeDestination struct {
	constructs.Construct
	bus        awsevents.IEventBus
	ownBus     awsevents.EventBus // nil when imported
	source     string
	publishers []string
}

func (d *eventBridgeDestination) Kind() sluiceoutbox.Kind  { return sluiceoutbox.EventBridge }
func (d *eventBridgeDestination) Address() *string         { return d.bus.EventBusArn() }
func (d *eventBridgeDestination) Bus() awsevents.IEventBus { return d.bus }
func (d *eventBridgeDestination) Source() string           { return d.source }

// eventSourcePattern is EventBridge's rule for a Source: 1 to 256 characters, no "aws." prefix.
var eventSourcePattern = regexp.MustCompile(`^[\x21-\x7e]{1,256}$`)

// NewEventBridgeDestination creates the bus (unless Bus imports one) the relay puts events on.
// It panics on invalid props, naming every problem.
func NewEventBridgeDestination(scope constructs.Construct, id string, props *EventBridgeDestinationProps) EventBridgeDestination {
	p := *props
	p.Source = orDefault(p.Source, sluiceoutbox.DefaultEventSource)
	var errs []error
	if p.Bus != nil && p.BusName != "" {
		errs = append(errs, errors.New("BusName names a new bus: leave it empty with Bus"))
	}
	if !eventSourcePattern.MatchString(p.Source) || strings.HasPrefix(p.Source, "aws.") {
		errs = append(errs, fmt.Errorf("Source %q must be 1 to 256 printable characters without spaces, not starting with \"aws.\"", p.Source))
	}
	if p.Bus != nil && len(p.Publishers) > 0 {
		errs = append(errs, errors.New("Publishers need a new bus (an imported bus keeps its own policy)"))
	}
	errs = append(errs, checkARNs("Publishers", p.Publishers)...)
	invalid("EventBridgeDestination", id, errs...)

	d := &eventBridgeDestination{source: p.Source, publishers: p.Publishers}
	constructs.NewConstruct_Override(d, scope, &id)
	d.bus = p.Bus
	if d.bus == nil {
		d.ownBus = awsevents.NewEventBus(d, jsii.String("Bus"), &awsevents.EventBusProps{
			EventBusName: jsiiOrNil(p.BusName),
			Description:  jsii.String("sluice outbox events (source " + p.Source + ")"),
		})
		d.bus = d.ownBus
	}
	return d
}

func (d *eventBridgeDestination) bindRelay(relay relayHost) {
	d.bus.GrantPutEventsTo(relay.Grantee(), nil)
	relay.AddEnvironment(jsii.String(lambdaenv.EventBridgeSource), jsii.String(d.source))
	if d.ownBus == nil {
		return
	}
	// Only the relay (and the listed publishers) may put events, as on the SNS topic.
	d.ownBus.AddToResourcePolicy(onlyTheRelay("OnlyTheRelayPutsEvents", relay, d.publishers, d.bus.EventBusArn(), "events:PutEvents"))
}

// KinesisDestinationProps configure a Kinesis data stream as a relay destination.
type KinesisDestinationProps struct {
	// Stream is an existing stream to publish to (give its EncryptionKey when it has a
	// customer-managed one, so the grants include it). Defaults to a new stream.
	Stream awskinesis.IStream
	// StreamName is the new stream's name. Defaults to a generated name. Not with Stream.
	StreamName string
	// ShardCount makes the new stream provisioned with this many shards (each takes 1,000
	// records or 1 MiB a second; the relay backs a throttled record off and retries it).
	// Defaults to 0: on-demand capacity.
	ShardCount int
	// Retention is how long the new stream keeps records: a consumer that falls further
	// behind, or a record in the failure destination not re-read in time, is lost to it.
	// Between 24 hours and 365 days. Defaults to 7 days.
	Retention time.Duration
	// Publishers are further IAM principal ARNs (roles) allowed to put records on a new
	// stream, e.g. an operator role that runs `sluice relay` or `sluice replay`. The stream's
	// resource policy (AWS::Kinesis::ResourcePolicy) denies kinesis:PutRecord and PutRecords
	// to every other principal but the relay's role (set when an outbox binds the stream), so
	// that nobody forges a record the consumers would apply. An imported stream keeps its own
	// policy. Defaults to none.
	Publishers []string
}

// KinesisDestination is a Kinesis data stream the relay puts records on.
type KinesisDestination interface {
	Destination
	// Stream is the data stream.
	Stream() awskinesis.IStream
}

type kinesisDestination struct {
	constructs.Construct
	stream     awskinesis.IStream
	own        bool // created here: its resource policy is ours to write
	publishers []string
}

func (d *kinesisDestination) Kind() sluiceoutbox.Kind    { return sluiceoutbox.Kinesis }
func (d *kinesisDestination) Address() *string           { return d.stream.StreamArn() }
func (d *kinesisDestination) Stream() awskinesis.IStream { return d.stream }

// NewKinesisDestination creates the stream (unless Stream imports one) the relay puts records
// on: encrypted with the aws/kinesis key, retained when the stack is deleted. It panics on
// invalid props, naming every problem.
func NewKinesisDestination(scope constructs.Construct, id string, props *KinesisDestinationProps) KinesisDestination {
	p := *props
	p.Retention = orDefault(p.Retention, 7*24*time.Hour)
	var errs []error
	if p.Stream != nil && (p.StreamName != "" || p.ShardCount != 0 || props.Retention != 0) {
		errs = append(errs, errors.New("StreamName, ShardCount and Retention shape a new stream: leave them unset with Stream"))
	}
	if p.ShardCount < 0 || p.ShardCount > 10000 {
		errs = append(errs, fmt.Errorf("ShardCount must be between 1 and 10000, or 0 for on-demand capacity, got %d", p.ShardCount))
	}
	if p.Retention < 24*time.Hour || p.Retention > 365*24*time.Hour || p.Retention%time.Hour != 0 {
		errs = append(errs, fmt.Errorf("Retention must be whole hours between 24h and 365 days, got %s", p.Retention))
	}
	if p.Stream != nil && len(p.Publishers) > 0 {
		errs = append(errs, errors.New("Publishers need a new stream (an imported stream keeps its own policy)"))
	}
	errs = append(errs, checkARNs("Publishers", p.Publishers)...)
	invalid("KinesisDestination", id, errs...)

	d := &kinesisDestination{stream: p.Stream, own: p.Stream == nil, publishers: p.Publishers}
	constructs.NewConstruct_Override(d, scope, &id)
	if d.stream == nil {
		sp := &awskinesis.StreamProps{
			StreamName:      jsiiOrNil(p.StreamName),
			Encryption:      awskinesis.StreamEncryption_MANAGED,
			RetentionPeriod: awscdk.Duration_Hours(jsii.Number(p.Retention.Hours())),
			StreamMode:      awskinesis.StreamMode_ON_DEMAND,
			// Records outlive the stack, like the queues' messages.
			RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
		}
		if p.ShardCount > 0 {
			sp.StreamMode, sp.ShardCount = awskinesis.StreamMode_PROVISIONED, jsii.Number(float64(p.ShardCount))
		}
		d.stream = awskinesis.NewStream(d, jsii.String("Stream"), sp)
	}
	return d
}

func (d *kinesisDestination) bindRelay(relay relayHost) {
	// PutRecords only: the relay names the stream by its ARN and never reads or describes it.
	d.stream.Grant(relay.Grantee(), jsii.String("kinesis:PutRecords"))
	if key := d.stream.EncryptionKey(); key != nil {
		key.Grant(relay.Grantee(), jsii.String("kms:GenerateDataKey"))
	}
	if !d.own {
		return
	}
	// Only the relay (and the listed publishers) may put records: a Deny in the stream's
	// resource policy wins over any identity policy in the account, as on the SNS topic and the
	// EventBridge bus. Reading, and changing the policy itself, stay with IAM.
	d.stream.AddToResourcePolicy(onlyTheRelay("OnlyTheRelayPutsRecords", relay, d.publishers, d.stream.StreamArn(),
		"kinesis:PutRecord", "kinesis:PutRecords"))
}

// MskBrokerPort is the port of MSK's brokers for IAM access control (SASL/IAM over TLS), which
// the relay and the consumers' event source mappings use.
const MskBrokerPort = 9098

// MskDestinationProps configure a Kafka topic on Amazon MSK as a relay destination. The relay
// authenticates with MSK IAM access control (SLUICE_KAFKA_AUTH=iam, over TLS): the cluster must
// have IAM client authentication enabled.
type MskDestinationProps struct {
	// Topic is the Kafka topic the relay produces to (kafka://TOPIC). Required.
	Topic string
	// ClusterArn is an existing cluster, provisioned or Serverless, with IAM client
	// authentication. Defaults to a new MSK Serverless cluster in Network.
	ClusterArn string
	// SecurityGroups are the existing cluster's security groups: each gets ingress on
	// MskBrokerPort from the relay (and from the consumers subscribed to the topic). Leave
	// empty when you manage those rules. Not used for a new cluster, which gets its own.
	SecurityGroups []awsec2.ISecurityGroup
	// BootstrapBrokers is the cluster's IAM bootstrap string (host:9098,..., as `aws kafka
	// get-bootstrap-brokers` prints it in BootstrapBrokerStringSaslIam): the relay's
	// SLUICE_KAFKA_BROKERS. Defaults to looking it up at deploy time (a custom resource
	// calling kafka:GetBootstrapBrokers).
	BootstrapBrokers string
	// Network places a new Serverless cluster: Network.Vpc and its Subnets (at least two, in
	// different availability zones); with Network.ApiEndpoints (which must include the lambda
	// and sts endpoints) the cluster's security group allows HTTPS only to them, otherwise to
	// any address. Required without ClusterArn; not used with it.
	Network Network
	// Partitions, when positive, creates the topic with this many partitions (AWS::MSK::Topic:
	// provisioned clusters on Kafka 3.6 or later only; MSK's topic API does not serve
	// Serverless, where the topic is created with Kafka's admin tools). Defaults to 0: the
	// topic exists.
	Partitions int
	// ReplicationFactor of a topic created with Partitions. Defaults to 3.
	ReplicationFactor int
	// MaxMessageBytes is the largest record the brokers accept (SLUICE_KAFKA_MAX_MESSAGE_BYTES):
	// a larger row is quarantined, or its payload goes to the claim check. Defaults to
	// 1,000,000 bytes (outbox.RelaySetting("MessageLimits.Kafka")).
	MaxMessageBytes int
}

// MskDestination is a Kafka topic on an MSK cluster the relay produces to.
type MskDestination interface {
	Destination
	// ClusterArn is the cluster's ARN.
	ClusterArn() *string
	// Topic is the Kafka topic name.
	Topic() string
	// BootstrapBrokers is the IAM bootstrap string the relay connects to.
	BootstrapBrokers() *string
	// Connections reaches the brokers: the relay is allowed in on MskBrokerPort (a new
	// cluster's group also admits itself, for the consumers' event source mappings, which poll
	// from the cluster's subnets with its security groups). Nil for an existing cluster without
	// SecurityGroups.
	Connections() awsec2.Connections
}

type mskDestination struct {
	constructs.Construct
	clusterArn  *string
	topic       string
	brokers     *string
	connections awsec2.Connections
	maxBytes    int
}

func (d *mskDestination) Kind() sluiceoutbox.Kind         { return sluiceoutbox.Kafka }
func (d *mskDestination) Address() *string                { return jsii.String("kafka://" + d.topic) }
func (d *mskDestination) ClusterArn() *string             { return d.clusterArn }
func (d *mskDestination) Topic() string                   { return d.topic }
func (d *mskDestination) BootstrapBrokers() *string       { return d.brokers }
func (d *mskDestination) Connections() awsec2.Connections { return d.connections }

// kafkaTopicPattern is Kafka's rule for topic names.
var kafkaTopicPattern = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// NewMskDestination creates the MSK Serverless cluster (unless ClusterArn names one) and the
// topic (with Partitions) the relay produces to. It panics on invalid props, naming every
// problem.
func NewMskDestination(scope constructs.Construct, id string, props *MskDestinationProps) MskDestination {
	p := *props
	p.ReplicationFactor = orDefault(p.ReplicationFactor, 3)
	var errs []error
	if !kafkaTopicPattern.MatchString(p.Topic) {
		errs = append(errs, fmt.Errorf("Topic %q must be 1 to 249 letters, digits, '.', '_' or '-'", p.Topic))
	}
	if p.ClusterArn != "" {
		if !strings.HasPrefix(p.ClusterArn, "arn:") || !strings.Contains(p.ClusterArn, ":cluster/") {
			errs = append(errs, fmt.Errorf("ClusterArn %q is not an MSK cluster ARN (arn:aws:kafka:REGION:ACCOUNT:cluster/NAME/UUID)", p.ClusterArn))
		}
		if p.Network.Vpc != nil {
			errs = append(errs, errors.New("Network places a new cluster: leave it empty with ClusterArn"))
		}
	} else {
		if err := p.Network.validate(); err != nil {
			errs = append(errs, fmt.Errorf("a new MSK Serverless cluster needs Network: %w", err))
		}
		if len(p.SecurityGroups) > 0 {
			errs = append(errs, errors.New("SecurityGroups are an existing cluster's: a new cluster gets its own"))
		}
		if p.Partitions > 0 {
			errs = append(errs, errors.New("Partitions creates the topic with MSK's topic API, which does not serve MSK Serverless: "+
				"create the topic with Kafka's admin tools, or name a provisioned cluster with ClusterArn"))
		}
	}
	if p.Partitions < 0 {
		errs = append(errs, fmt.Errorf("Partitions must not be negative, got %d", p.Partitions))
	}
	if p.ReplicationFactor < 1 {
		errs = append(errs, fmt.Errorf("ReplicationFactor must be positive, got %d", p.ReplicationFactor))
	}
	if p.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxMessageBytes must not be negative, got %d", p.MaxMessageBytes))
	}
	if p.BootstrapBrokers != "" {
		for _, b := range strings.Split(p.BootstrapBrokers, ",") {
			if _, port, ok := strings.Cut(strings.TrimSpace(b), ":"); !ok || port == "" {
				errs = append(errs, fmt.Errorf("BootstrapBrokers: %q is not host:port", b))
			}
		}
	}
	invalid("MskDestination", id, errs...)

	d := &mskDestination{topic: p.Topic, maxBytes: p.MaxMessageBytes}
	constructs.NewConstruct_Override(d, scope, &id)
	this := d
	brokerPort := awsec2.Port_Tcp(jsii.Number(MskBrokerPort))
	if p.ClusterArn != "" {
		d.clusterArn = jsii.String(p.ClusterArn)
		if len(p.SecurityGroups) > 0 {
			d.connections = awsec2.NewConnections(&awsec2.ConnectionsProps{SecurityGroups: &p.SecurityGroups, DefaultPort: brokerPort})
		}
	} else {
		subnets := p.Network.Subnets
		if subnets == nil {
			subnets = &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_WITH_EGRESS}
		}
		sg := awsec2.NewSecurityGroup(this, jsii.String("ClusterSecurityGroup"), &awsec2.SecurityGroupProps{
			Vpc:              p.Network.Vpc,
			Description:      jsii.String("sluice MSK Serverless: IAM brokers port from the relay and the consumer event source mappings"),
			AllowAllOutbound: jsii.Bool(false),
		})
		// The consumers' event source mappings poll from ENIs with this security group: they
		// reach the brokers through it, and the Lambda and STS APIs over HTTPS.
		sg.Connections().AllowInternally(brokerPort, jsii.String("sluice MSK event source mappings to the brokers"))
		if p.Network.ApiEndpoints != nil {
			sg.Connections().AllowTo(p.Network.ApiEndpoints, awsec2.Port_Tcp(jsii.Number(443)),
				jsii.String("sluice MSK event source mappings to the Lambda and STS endpoints"))
		} else {
			sg.AddEgressRule(awsec2.Peer_AnyIpv4(), awsec2.Port_Tcp(jsii.Number(443)),
				jsii.String("sluice MSK event source mappings to the Lambda and STS APIs"), nil)
		}
		d.connections = awsec2.NewConnections(&awsec2.ConnectionsProps{SecurityGroups: &[]awsec2.ISecurityGroup{sg}, DefaultPort: brokerPort})
		cluster := awsmsk.NewCfnServerlessCluster(this, jsii.String("Cluster"), &awsmsk.CfnServerlessClusterProps{
			ClusterName: awscdk.Names_UniqueResourceName(this, &awscdk.UniqueResourceNameOptions{MaxLength: jsii.Number(64), Separator: jsii.String("-")}),
			ClientAuthentication: &awsmsk.CfnServerlessCluster_ClientAuthenticationProperty{
				Sasl: &awsmsk.CfnServerlessCluster_SaslProperty{Iam: &awsmsk.CfnServerlessCluster_IamProperty{Enabled: jsii.Bool(true)}},
			},
			VpcConfigs: []any{&awsmsk.CfnServerlessCluster_VpcConfigProperty{
				SubnetIds:      p.Network.Vpc.SelectSubnets(subnets).SubnetIds,
				SecurityGroups: jsii.Strings(*sg.SecurityGroupId()),
			}},
		})
		d.clusterArn = cluster.AttrArn()
	}
	if p.Partitions > 0 {
		awsmsk.NewCfnTopic(this, jsii.String("Topic"), &awsmsk.CfnTopicProps{
			ClusterArn: d.clusterArn, TopicName: jsii.String(p.Topic),
			PartitionCount: jsii.Number(float64(p.Partitions)), ReplicationFactor: jsii.Number(float64(p.ReplicationFactor)),
		})
	}
	if p.BootstrapBrokers != "" {
		d.brokers = jsii.String(p.BootstrapBrokers)
	} else {
		lookup := &customresources.AwsSdkCall{
			Service: jsii.String("Kafka"), Action: jsii.String("getBootstrapBrokers"),
			Parameters:         map[string]any{"ClusterArn": d.clusterArn},
			PhysicalResourceId: customresources.PhysicalResourceId_Of(d.clusterArn),
			OutputPaths:        jsii.Strings("BootstrapBrokerStringSaslIam"),
		}
		cr := customresources.NewAwsCustomResource(this, jsii.String("BootstrapBrokers"), &customresources.AwsCustomResourceProps{
			OnCreate: lookup, OnUpdate: lookup,
			Policy:              customresources.AwsCustomResourcePolicy_FromSdkCalls(&customresources.SdkCallsPolicyOptions{Resources: &[]*string{d.clusterArn}}),
			InstallLatestAwsSdk: jsii.Bool(false),
		})
		d.brokers = cr.GetResponseField(jsii.String("BootstrapBrokerStringSaslIam"))
		suppressAwsCustomResource(this)
	}
	return d
}

// kafkaResourceArn turns the cluster ARN arn:aws:kafka:R:A:cluster/NAME/UUID into the ARN of
// one of its topics or groups, arn:aws:kafka:R:A:KIND/NAME/UUID/RESOURCE, for MSK IAM access
// control. It works on a token (a new cluster's ARN) too.
func kafkaResourceArn(cluster *string, kind, resource string) *string {
	parts := awscdk.Fn_Split(jsii.String(":cluster/"), cluster, nil)
	return awscdk.Fn_Join(jsii.String(""), &[]*string{
		awscdk.Fn_Select(jsii.Number(0), parts), jsii.String(":" + kind + "/"), awscdk.Fn_Select(jsii.Number(1), parts), jsii.String("/" + resource),
	})
}

func (d *mskDestination) bindRelay(relay relayHost) {
	// Connect, and the idempotent producer's InitProducerId, on the cluster; metadata and
	// produce on the topic.
	relay.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("kafka-cluster:Connect", "kafka-cluster:WriteDataIdempotently"),
		Resources: &[]*string{d.clusterArn},
	}))
	relay.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Actions:   jsii.Strings("kafka-cluster:DescribeTopic", "kafka-cluster:WriteData"),
		Resources: &[]*string{kafkaResourceArn(d.clusterArn, "topic", d.topic)},
	}))
	relay.AddEnvironment(jsii.String(lambdaenv.KafkaBrokers), d.brokers)
	relay.AddEnvironment(jsii.String(lambdaenv.KafkaAuth), jsii.String("iam"))
	if d.maxBytes > 0 {
		relay.AddEnvironment(jsii.String(sluiceoutbox.RelaySetting("MessageLimits.Kafka").Env), jsii.String(strconv.Itoa(d.maxBytes)))
	}
	if d.connections != nil {
		relay.Connections().AllowTo(d.connections, awsec2.Port_Tcp(jsii.Number(MskBrokerPort)), jsii.String("sluice outbox relay to the MSK brokers"))
	}
}

// checkDestinations reports what one relay cannot serve among an outbox's destinations: a
// missing one, names routed twice, EventBridge destinations with different Sources, Kafka
// destinations on different clusters (the relay has one setting of each).
func checkDestinations(p *OutboxProps) []error {
	var errs []error
	sources, clusters := map[string]bool{}, map[string]bool{}
	for _, name := range sortedKeys(p.Destinations) {
		d := p.Destinations[name]
		if name == "" || d == nil {
			errs = append(errs, fmt.Errorf("Destinations entry %q must have a name and a destination", name))
			continue
		}
		if _, ok := p.ExtraTopics[name]; ok {
			errs = append(errs, fmt.Errorf("logical topic %q is both in ExtraTopics and Destinations", name))
		}
		for _, t := range p.LogicalTopics {
			if t == name {
				errs = append(errs, fmt.Errorf("logical topic %q is both in LogicalTopics and Destinations", name))
			}
		}
		switch d := d.(type) {
		case *eventBridgeDestination:
			sources[d.source] = true
		case *mskDestination:
			clusters[fmt.Sprint(awscdk.Token_AsString(d.clusterArn, nil))] = true
		}
	}
	if d := p.DefaultDestination; d != nil {
		switch d := d.(type) {
		case *eventBridgeDestination:
			sources[d.source] = true
		case *mskDestination:
			clusters[fmt.Sprint(awscdk.Token_AsString(d.clusterArn, nil))] = true
		}
		if p.DefaultToTopic {
			errs = append(errs, errors.New("DefaultDestination and DefaultToTopic exclude each other: one default receives the unrouted rows"))
		}
	}
	if len(sources) > 1 {
		errs = append(errs, fmt.Errorf("the EventBridge destinations have different Sources %v: the relay puts every event with one (SLUICE_EVENTBRIDGE_SOURCE)", sortedKeys(sources)))
	}
	if len(clusters) > 1 {
		errs = append(errs, fmt.Errorf("the MSK destinations are on %d clusters: the relay produces to one (SLUICE_KAFKA_BROKERS)", len(clusters)))
	}
	return errs
}

// bindDestinations gives the relay what each of its destinations needs, once per destination.
func bindDestinations(relay relayHost, p *OutboxProps) {
	seen := map[Destination]bool{}
	bind := func(d Destination) {
		if d != nil && !seen[d] {
			seen[d] = true
			d.bindRelay(relay)
		}
	}
	for _, name := range sortedKeys(p.Destinations) {
		bind(p.Destinations[name])
	}
	bind(p.DefaultDestination)
}

func checkARNs(field string, arns []string) []error {
	var errs []error
	for i, a := range arns {
		if !strings.HasPrefix(a, "arn:") {
			errs = append(errs, fmt.Errorf("%s[%d] %q is not an ARN", field, i, a))
		}
	}
	return errs
}

// suppressAwsCustomResource records why the cdk-nag findings on the AwsCustomResource
// provider (one Node.js function per stack, made by CDK) are acceptable.
func suppressAwsCustomResource(scope constructs.Construct) {
	stack := awscdk.Stack_Of(scope)
	provider := stack.Node().TryFindChild(jsii.String("AWS679f53fac002430cb0da5b7982bd2287"))
	if provider == nil {
		return
	}
	suppress(provider, "AwsSolutions-IAM4",
		"CDK's AwsCustomResource provider runs with AWSLambdaBasicExecutionRole (its own logs only); its calls "+
			"(kafka:GetBootstrapBrokers on the cluster, ec2:DescribeManagedPrefixLists) are statements of each custom resource's own policy.",
		"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole")
	suppress(provider, "AwsSolutions-L1",
		"The AwsCustomResource provider's Node.js runtime is CDK's choice, updated with aws-cdk-lib; it runs at deploy time only.")
}
