package infra

import (
	"errors"
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/jsii-runtime-go"
	sluiceoutbox "github.com/sluicehq/sluice/pkg/outbox"
)

// The example stack's destinations (SluiceStackProps.Destination).
const (
	// DestinationSNS: the outbox's SNS topic and an SQS consumer (the default).
	DestinationSNS = "sns"
	// DestinationEventBridge: a new event bus; the consumer's queue is a rule's target.
	DestinationEventBridge = "eventbridge"
	// DestinationKinesis: a new on-demand Kinesis stream read by the consumer's mapping.
	DestinationKinesis = "kinesis"
	// DestinationMSK: a Kafka topic on MSK (SluiceStackProps.MskClusterArn, or a new MSK
	// Serverless cluster) read by the consumer's mapping.
	DestinationMSK = "msk"
)

// DefaultMskTopic is the example's Kafka topic (SluiceStackProps.MskTopic).
const DefaultMskTopic = "sluice-events"

func checkExampleDestination(p *SluiceStackProps) []error {
	var errs []error
	switch p.Destination {
	case "", DestinationSNS, DestinationEventBridge, DestinationKinesis, DestinationMSK:
	default:
		errs = append(errs, fmt.Errorf("Destination %q must be %s, %s, %s or %s", p.Destination,
			DestinationSNS, DestinationEventBridge, DestinationKinesis, DestinationMSK))
	}
	if p.Destination != DestinationMSK && (p.MskClusterArn != "" || p.MskSecurityGroupID != "" || p.MskTopic != "") {
		errs = append(errs, errors.New("MskClusterArn, MskSecurityGroupID and MskTopic need Destination msk"))
	}
	if p.MskSecurityGroupID != "" && p.MskClusterArn == "" {
		errs = append(errs, errors.New("MskSecurityGroupID is an existing cluster's: set MskClusterArn"))
	}
	if p.Fifo && p.Destination != "" && p.Destination != DestinationSNS {
		errs = append(errs, fmt.Errorf("Fifo makes an SNS FIFO topic: Destination %s has no message groups", p.Destination))
	}
	return errs
}

// exampleEndpoints are the interface endpoints the example's hosts call AWS through, by
// construct id: Secrets Manager (every function and task, and the rotations); SNS when a relay
// publishes to a topic (the SNS destination, a fleet); EventBridge or Kinesis for the relay's
// destination; Lambda and STS for an MSK mapping's pollers, in the cluster's subnets; ECR (API
// and Docker registry) and CloudWatch Logs for the Fargate relay's tasks, which pull their
// image and write their logs themselves (a Lambda's logs leave through the Lambda service,
// and SQS is polled by it, so neither needs an endpoint).
func exampleEndpoints(p *SluiceStackProps) map[string]awsec2.InterfaceVpcEndpointAwsService {
	eps := map[string]awsec2.InterfaceVpcEndpointAwsService{secretsManagerEndpoint: awsec2.InterfaceVpcEndpointAwsService_SECRETS_MANAGER()}
	switch p.Destination {
	case "", DestinationSNS:
		eps[snsEndpoint] = awsec2.InterfaceVpcEndpointAwsService_SNS()
	case DestinationEventBridge:
		eps[eventBridgeEndpoint] = awsec2.InterfaceVpcEndpointAwsService_EVENTBRIDGE()
	case DestinationKinesis:
		eps[kinesisEndpoint] = awsec2.InterfaceVpcEndpointAwsService_KINESIS_STREAMS()
	case DestinationMSK:
		eps[lambdaEndpoint], eps[stsEndpoint] = awsec2.InterfaceVpcEndpointAwsService_LAMBDA(), awsec2.InterfaceVpcEndpointAwsService_STS()
	}
	if p.Fleet > 0 {
		eps[snsEndpoint] = awsec2.InterfaceVpcEndpointAwsService_SNS()
	}
	if p.RelayImageDir != "" {
		eps[ecrAPIEndpoint] = awsec2.InterfaceVpcEndpointAwsService_ECR()
		eps[ecrDockerEndpoint] = awsec2.InterfaceVpcEndpointAwsService_ECR_DOCKER()
		eps[logsEndpoint] = awsec2.InterfaceVpcEndpointAwsService_CLOUDWATCH_LOGS()
	}
	return eps
}

// newExampleDestination creates the example's destination; nil for SNS.
func newExampleDestination(stack awscdk.Stack, network Network, p *SluiceStackProps) Destination {
	switch p.Destination {
	case DestinationEventBridge:
		return NewEventBridgeDestination(stack, "EventBus", &EventBridgeDestinationProps{Publishers: p.Publishers})
	case DestinationKinesis:
		return NewKinesisDestination(stack, "Stream", &KinesisDestinationProps{Publishers: p.Publishers})
	case DestinationMSK:
		mp := &MskDestinationProps{Topic: orDefault(p.MskTopic, DefaultMskTopic), ClusterArn: p.MskClusterArn}
		if p.MskClusterArn == "" {
			// The mapping's pollers reach the Lambda and STS endpoints from the cluster's group.
			mp.Network = Network{Vpc: network.Vpc, Subnets: network.Subnets, ApiEndpoints: network.ApiEndpoints}
		} else if p.MskSecurityGroupID != "" {
			mp.SecurityGroups = []awsec2.ISecurityGroup{awsec2.SecurityGroup_FromSecurityGroupId(stack, jsii.String("MskSecurityGroup"),
				jsii.String(p.MskSecurityGroupID), &awsec2.SecurityGroupImportOptions{AllowAllOutbound: jsii.Bool(false)})}
		}
		return NewMskDestination(stack, "Kafka", mp)
	}
	return nil
}

// exampleDestinationOutputs names what the example's destination is, for operators.
func exampleDestinationOutputs(out func(name, description string, value *string), d Destination) {
	switch d.Kind() {
	case sluiceoutbox.EventBridge:
		out("EventBusArn", "EventBridge bus the relay puts events on", d.Address())
	case sluiceoutbox.Kinesis:
		out("StreamArn", "Kinesis stream the relay puts records on", d.Address())
	case sluiceoutbox.Kafka:
		m := d.(MskDestination)
		out("KafkaTopic", "Kafka topic the relay produces to", jsii.String(m.Topic()))
		out("MskClusterArn", "MSK cluster", m.ClusterArn())
		out("KafkaBootstrapBrokers", "The cluster's IAM bootstrap brokers (SLUICE_KAFKA_BROKERS)", m.BootstrapBrokers())
	}
}
