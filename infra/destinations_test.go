package infra_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskinesis"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// destinationStack synthesizes the example stack with the given destination, with cdk-nag.
func destinationStack(t *testing.T, destination string) (infra.SluiceStack, assertions.Template) {
	t.Helper()
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Dest"+destination, &infra.SluiceStackProps{
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
		CABundle: caBundle(t), NoAlarmDestination: true, Destination: destination, ConsumerName: "orders",
		Redrivers: []string{"arn:aws:iam::111111111111:role/operator"},
	})
	withNag(s)
	return s, assertions.Template_FromStack(s, nil)
}

func relayOf(t *testing.T, s infra.SluiceStack, tmpl assertions.Template) (fn map[string]any, roleID string) {
	t.Helper()
	fn = resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(s.Outbox().Relay().Node().DefaultChild().(awscdk.CfnElement))]
	require.NotNil(t, fn)
	return fn, refID(props(fn)["Role"])
}

// statements returns the identity policy statements attached to a role, by action.
func statements(tmpl assertions.Template, roleID string) map[string][]map[string]any {
	out := map[string][]map[string]any{}
	for _, r := range resources(tmpl, "AWS::IAM::Policy") {
		p := props(r)
		attached := false
		for _, role := range asList(p["Roles"]) {
			if refID(role) == roleID {
				attached = true
			}
		}
		if !attached {
			continue
		}
		for _, s := range p["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			st := s.(map[string]any)
			for _, a := range asList(st["Action"]) {
				out[a.(string)] = append(out[a.(string)], st)
			}
		}
	}
	return out
}

// alarmOn finds the alarm on a metric of a namespace.
func alarmOn(t *testing.T, tmpl assertions.Template, namespace, metric string) map[string]any {
	t.Helper()
	for _, a := range resources(tmpl, "AWS::CloudWatch::Alarm") {
		if p := props(a); p["Namespace"] == namespace && p["MetricName"] == metric {
			return p
		}
	}
	t.Fatalf("no alarm on %s %s", namespace, metric)
	return nil
}

func requireEndpoint(t *testing.T, tmpl assertions.Template, service string) {
	t.Helper()
	for _, r := range resources(tmpl, "AWS::EC2::VPCEndpoint") {
		if strings.Contains(fmt.Sprint(props(r)["ServiceName"]), "."+service) {
			return
		}
	}
	t.Fatalf("no %s VPC endpoint", service)
}

// EventBridge: the relay puts events on a new bus (nobody else may), a rule sends the relay's
// source to the consumer's queue (each event whole, as inbox.Parse reads it), with the
// subscription DLQ as the target's DLQ; the queue and key admit EventBridge for this rule only; the SQS path and its
// alarms are the SNS consumer's, plus FailedInvocations on the rule.
func TestEventBridgeDestination(t *testing.T) {
	s, tmpl := destinationStack(t, infra.DestinationEventBridge)
	requireNoNagErrors(t, s)
	requireNoWildcardGrants(t, tmpl)
	relay, relayRole := relayOf(t, s, tmpl)
	busID := firstKey(resources(tmpl, "AWS::Events::EventBus"))
	require.NotEmpty(t, busID)
	busArn := map[string]any{"Fn::GetAtt": []any{busID, "Arn"}}

	require.Equal(t, busArn, env(relay)[lambdaenv.DefaultTopicARN], "the bus is the relay's default destination")
	require.Equal(t, "sluice", env(relay)[lambdaenv.EventBridgeSource])
	put := statements(tmpl, relayRole)["events:PutEvents"]
	require.Len(t, put, 1)
	require.Equal(t, busArn, put[0]["Resource"])
	tmpl.HasResourceProperties(jsii.String("AWS::Events::EventBusPolicy"), map[string]any{
		"Statement": map[string]any{"Effect": "Deny", "Action": "events:PutEvents", "Principal": map[string]any{"AWS": "*"},
			"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": []any{map[string]any{"Fn::GetAtt": []any{relayRole, "Arn"}}}}}},
	})

	ruleName, queueArn, dlqArn := assertions.NewCapture(nil), assertions.NewCapture(nil), assertions.NewCapture(nil)
	tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{
		"EventBusName": map[string]any{"Ref": busID}, "EventPattern": map[string]any{"source": []any{"sluice"}}, "Name": ruleName,
		"Targets": []any{map[string]any{"Id": "Queue", "Arn": queueArn, "InputPath": assertions.Match_Absent(), "InputTransformer": assertions.Match_Absent(),
			"DeadLetterConfig": map[string]any{"Arn": dlqArn}, "RetryPolicy": map[string]any{"MaximumRetryAttempts": 185.0, "MaximumEventAgeInSeconds": 86400.0}}},
	})
	require.Equal(t, *s.GetLogicalId(s.Consumer().Queue().Node().DefaultChild().(awscdk.CfnElement)), refID(queueArn.AsObject()))
	require.Equal(t, *s.GetLogicalId(s.Consumer().SubscriptionDeadLetterQueue().Node().DefaultChild().(awscdk.CfnElement)), refID(dlqArn.AsObject()))
	tmpl.ResourceCountIs(jsii.String("AWS::SNS::Subscription"), jsii.Number(0)) // neither queue nor e-mail
	tmpl.ResourceCountIs(jsii.String("AWS::Lambda::EventSourceMapping"), jsii.Number(1))
	tmpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"EventSourceArn": queueArn.AsObject(), "FunctionResponseTypes": []any{"ReportBatchItemFailures"},
	})

	// Every statement for events.amazonaws.com, on queues and keys, names this rule.
	ruleArn := ""
	n := 0
	check := func(st map[string]any) {
		if p, ok := st["Principal"].(map[string]any); ok && p["Service"] == "events.amazonaws.com" {
			cond := fmt.Sprint(st["Condition"])
			require.Contains(t, cond, "ArnEquals", "scoped: %v", st)
			require.Contains(t, cond, *ruleName.AsString(), "to the consumer's rule: %v", st)
			if ruleArn == "" {
				ruleArn = cond
			}
			require.Equal(t, ruleArn, cond, "one rule ARN everywhere")
			n++
		}
	}
	for _, r := range resources(tmpl, "AWS::SQS::QueuePolicy") {
		for _, st := range props(r)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			check(st.(map[string]any))
		}
	}
	for _, r := range resources(tmpl, "AWS::KMS::Key") {
		for _, st := range props(r)["KeyPolicy"].(map[string]any)["Statement"].([]any) {
			check(st.(map[string]any))
		}
	}
	require.Equal(t, 3, n, "queue, its DLQ for the rule, and the key")
	deny := assertions.NewCapture(nil)
	tmpl.HasResourceProperties(jsii.String("AWS::SQS::QueuePolicy"), map[string]any{
		"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
			"Sid": "OnlyTheRuleAndRedriversSend", "Effect": "Deny", "Condition": deny,
		})})},
	})
	not := (*deny.AsObject())["ArnNotEquals"].(map[string]any)
	require.Equal(t, []any{"arn:aws:iam::111111111111:role/operator"}, not["aws:PrincipalArn"])
	require.Contains(t, fmt.Sprint(not["aws:SourceArn"]), *ruleName.AsString())

	failed := alarmOn(t, tmpl, "AWS/Events", "FailedInvocations")
	require.ElementsMatch(t, []any{
		map[string]any{"Name": "RuleName", "Value": *ruleName.AsString()},
		map[string]any{"Name": "EventBusName", "Value": map[string]any{"Ref": busID}},
	}, failed["Dimensions"])
	require.Equal(t, 0.0, failed["Threshold"])
	alarmOn(t, tmpl, "AWS/SQS", "ApproximateAgeOfOldestMessage")
	requireEndpoint(t, tmpl, "events")
}

// Kinesis: the relay may PutRecords on a new on-demand stream (aws/kinesis key, retained); the
// consumer reads it with a mapping that reports item failures, bisects, retries 10 times and
// sends failure records to the DLQ; no queue; reserved concurrency caps the connections; the
// iterator age is alarmed on.
func TestKinesisDestination(t *testing.T) {
	s, tmpl := destinationStack(t, infra.DestinationKinesis)
	requireNoNagErrors(t, s)
	requireNoWildcardGrants(t, tmpl)
	relay, relayRole := relayOf(t, s, tmpl)
	streams := resources(tmpl, "AWS::Kinesis::Stream")
	require.Len(t, streams, 1)
	streamID := firstKey(streams)
	require.Equal(t, "Retain", streams[streamID]["DeletionPolicy"])
	require.Equal(t, map[string]any{"EncryptionType": "KMS", "KeyId": "alias/aws/kinesis"}, props(streams[streamID])["StreamEncryption"])
	require.Equal(t, map[string]any{"StreamMode": "ON_DEMAND"}, props(streams[streamID])["StreamModeDetails"])
	require.Equal(t, 168.0, props(streams[streamID])["RetentionPeriodHours"])
	streamArn := map[string]any{"Fn::GetAtt": []any{streamID, "Arn"}}
	require.Equal(t, streamArn, env(relay)[lambdaenv.DefaultTopicARN])

	relayGrants := statements(tmpl, relayRole)
	require.Len(t, relayGrants["kinesis:PutRecords"], 1)
	require.Equal(t, streamArn, relayGrants["kinesis:PutRecords"][0]["Resource"])
	for action := range relayGrants {
		require.False(t, strings.HasPrefix(action, "kinesis:") && action != "kinesis:PutRecords", "the relay only puts records: %s", action)
	}

	dlq := *s.GetLogicalId(s.Consumer().DeadLetterQueue().Node().DefaultChild().(awscdk.CfnElement))
	tmpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"EventSourceArn":             streamArn,
		"FunctionResponseTypes":      []any{"ReportBatchItemFailures"},
		"BisectBatchOnFunctionError": true,
		"MaximumRetryAttempts":       10.0,
		"ParallelizationFactor":      1.0,
		"StartingPosition":           "TRIM_HORIZON",
		"DestinationConfig":          map[string]any{"OnFailure": map[string]any{"Destination": map[string]any{"Fn::GetAtt": []any{dlq, "Arn"}}}},
	})
	require.Nil(t, s.Consumer().Queue())
	tmpl.ResourceCountIs(jsii.String("AWS::SQS::Queue"), jsii.Number(1)) // the DLQ of failure records only
	consumerFn := resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(s.Consumer().Function().Node().DefaultChild().(awscdk.CfnElement))]
	require.Equal(t, 5.0, props(consumerFn)["ReservedConcurrentExecutions"], "MaxConcurrency caps a stream consumer")
	require.Equal(t, "11", env(consumerFn)[lambdaenv.ConsumerStreamMaxAttempts], "the mapping's 10 retries + 1: the last marks a dead letter dead")
	require.NotContains(t, env(consumerFn), lambdaenv.ConsumerMaxReceiveCount, "no queue")
	consumerGrants := statements(tmpl, refID(props(consumerFn)["Role"]))
	require.Contains(t, consumerGrants, "kinesis:GetRecords")
	require.Contains(t, consumerGrants, "sqs:SendMessage", "the mapping sends failure records to the DLQ")

	age := alarmOn(t, tmpl, "AWS/Lambda", "IteratorAge")
	require.Equal(t, 300000.0, age["Threshold"], "5 minutes, in milliseconds")
	require.Equal(t, "Maximum", age["Statistic"])
	alarmOn(t, tmpl, "AWS/SQS", "ApproximateNumberOfMessagesVisible") // the DLQ
	for _, a := range resources(tmpl, "AWS::CloudWatch::Alarm") {
		require.NotEqual(t, "ApproximateAgeOfOldestMessage", props(a)["MetricName"], "no queue, no queue age")
	}
	requireEndpoint(t, tmpl, "kinesis-streams")
}

// MSK Serverless: the stack creates the cluster with IAM authentication in the Lambdas'
// subnets; the relay produces with IAM (Connect and idempotent writes on the cluster, describe
// and write on the topic only), reaches the brokers on 9098, and gets the bootstrap brokers
// from a deploy-time lookup; the consumer's mapping is in provisioned mode with item
// failures, bisect, bounded retries and the DLQ, and may read only its topic and group.
func TestMskDestination(t *testing.T) {
	s, tmpl := destinationStack(t, infra.DestinationMSK)
	requireNoNagErrors(t, s)
	requireNoWildcardGrants(t, tmpl)
	relay, relayRole := relayOf(t, s, tmpl)
	clusters := resources(tmpl, "AWS::MSK::ServerlessCluster")
	require.Len(t, clusters, 1)
	clusterID := firstKey(clusters)
	require.Equal(t, map[string]any{"Sasl": map[string]any{"Iam": map[string]any{"Enabled": true}}}, props(clusters[clusterID])["ClientAuthentication"])
	clusterArn := map[string]any{"Fn::GetAtt": []any{clusterID, "Arn"}}

	e := env(relay)
	require.Equal(t, "kafka://"+infra.DefaultMskTopic, e[lambdaenv.DefaultTopicARN])
	require.Equal(t, "iam", e[lambdaenv.KafkaAuth])
	brokers := e[lambdaenv.KafkaBrokers].(map[string]any)["Fn::GetAtt"].([]any)
	require.Equal(t, "BootstrapBrokerStringSaslIam", brokers[1])
	lookup := resources(tmpl, "Custom::AWS")[brokers[0].(string)]
	require.Contains(t, fmt.Sprint(props(lookup)["Create"]), `"action":"getBootstrapBrokers"`)
	require.Contains(t, fmt.Sprint(props(lookup)["Create"]), clusterID)

	relayGrants := statements(tmpl, relayRole)
	for _, a := range []string{"kafka-cluster:Connect", "kafka-cluster:WriteDataIdempotently"} {
		require.Len(t, relayGrants[a], 1, a)
		require.Equal(t, clusterArn, relayGrants[a][0]["Resource"], a)
	}
	for _, a := range []string{"kafka-cluster:DescribeTopic", "kafka-cluster:WriteData"} {
		require.Len(t, relayGrants[a], 1, a)
		res := fmt.Sprint(relayGrants[a][0]["Resource"])
		require.Contains(t, res, ":topic/")
		require.Contains(t, res, "/"+infra.DefaultMskTopic)
	}
	require.NotContains(t, relayGrants, "kafka-cluster:ReadData")

	clusterSG := refID(props(clusters[clusterID])["VpcConfigs"].([]any)[0].(map[string]any)["SecurityGroups"].([]any)[0])
	relaySG := refID(props(relay)["VpcConfig"].(map[string]any)["SecurityGroupIds"].([]any)[0])
	tmpl.HasResourceProperties(jsii.String("AWS::EC2::SecurityGroupIngress"), map[string]any{
		"GroupId": map[string]any{"Fn::GetAtt": []any{clusterSG, "GroupId"}}, "SourceSecurityGroupId": map[string]any{"Fn::GetAtt": []any{relaySG, "GroupId"}},
		"FromPort": 9098.0, "ToPort": 9098.0, "IpProtocol": "tcp",
	})
	tmpl.HasResourceProperties(jsii.String("AWS::EC2::SecurityGroupEgress"), map[string]any{
		"GroupId": map[string]any{"Fn::GetAtt": []any{relaySG, "GroupId"}}, "DestinationSecurityGroupId": map[string]any{"Fn::GetAtt": []any{clusterSG, "GroupId"}},
		"FromPort": 9098.0,
	})

	dlq := *s.GetLogicalId(s.Consumer().DeadLetterQueue().Node().DefaultChild().(awscdk.CfnElement))
	tmpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"EventSourceArn":                      clusterArn,
		"Topics":                              []any{infra.DefaultMskTopic},
		"AmazonManagedKafkaEventSourceConfig": map[string]any{"ConsumerGroupId": "sluice-orders"},
		"FunctionResponseTypes":               []any{"ReportBatchItemFailures"},
		"BisectBatchOnFunctionError":          true,
		"MaximumRetryAttempts":                10.0,
		"StartingPosition":                    "TRIM_HORIZON",
		"ProvisionedPollerConfig":             map[string]any{"MinimumPollers": 1.0, "MaximumPollers": 5.0},
		"DestinationConfig":                   map[string]any{"OnFailure": map[string]any{"Destination": map[string]any{"Fn::GetAtt": []any{dlq, "Arn"}}}},
	})
	consumerFn := resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(s.Consumer().Function().Node().DefaultChild().(awscdk.CfnElement))]
	consumerGrants := statements(tmpl, refID(props(consumerFn)["Role"]))
	require.Contains(t, fmt.Sprint(consumerGrants["kafka-cluster:AlterGroup"][0]["Resource"]), "/sluice-orders")
	require.Contains(t, fmt.Sprint(consumerGrants["kafka-cluster:ReadData"][0]["Resource"]), ":topic/")
	require.NotContains(t, consumerGrants, "kafka-cluster:WriteData", "the consumer only reads")
	require.Equal(t, "11", env(consumerFn)[lambdaenv.ConsumerStreamMaxAttempts], "the mapping's 10 retries + 1")
	alarmOn(t, tmpl, "AWS/Lambda", "OffsetLag")
	requireEndpoint(t, tmpl, "lambda")
	requireEndpoint(t, tmpl, "sts")
}

// One relay may serve every kind at once: logical topics routed to an existing MSK cluster
// (its topic created, its security group opened, the brokers given), an imported stream and
// an imported bus, beside the SNS topic; consumers subscribe to the imported ones.
func TestMixedDestinationsOnOneRelay(t *testing.T) {
	app := awscdk.NewApp(nil)
	stack := awscdk.NewStack(app, jsii.String("Mixed"), &awscdk.StackProps{Env: &awscdk.Environment{Account: jsii.String("111111111111"), Region: jsii.String("eu-west-1")}})
	vpc := awsec2.Vpc_FromVpcAttributes(stack, jsii.String("Vpc"), &awsec2.VpcAttributes{
		VpcId: jsii.String("vpc-0123456789abcdef0"), AvailabilityZones: jsii.Strings("eu-west-1a"), PrivateSubnetIds: jsii.Strings("subnet-a"),
	})
	secret := awssecretsmanager.Secret_FromSecretCompleteArn(stack, jsii.String("Secret"), jsii.String("arn:aws:secretsmanager:eu-west-1:111111111111:secret:db-AbCdEf"))
	network, db := infra.Network{Vpc: vpc}, infra.Database{Secret: secret, CABundle: caBundle(t)}
	const cluster = "arn:aws:kafka:eu-west-1:111111111111:cluster/payments/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9-2"
	kafkaSG := awsec2.SecurityGroup_FromSecurityGroupId(stack, jsii.String("KafkaSG"), jsii.String("sg-0aaaaaaaaaaaaaaaa"), nil)
	msk := infra.NewMskDestination(stack, "Payments", &infra.MskDestinationProps{
		Topic: "payments", ClusterArn: cluster, SecurityGroups: []awsec2.ISecurityGroup{kafkaSG},
		BootstrapBrokers: "b-1.payments.kafka.eu-west-1.amazonaws.com:9098,b-2.payments.kafka.eu-west-1.amazonaws.com:9098",
		Partitions:       12, MaxMessageBytes: 4 << 20,
	})
	kin := infra.NewKinesisDestination(stack, "Clicks", &infra.KinesisDestinationProps{
		Stream: awskinesis.Stream_FromStreamArn(stack, jsii.String("ClickStream"), jsii.String("arn:aws:kinesis:eu-west-1:111111111111:stream/clicks")),
	})
	eb := infra.NewEventBridgeDestination(stack, "Audit", &infra.EventBridgeDestinationProps{
		Bus:    awsevents.EventBus_FromEventBusArn(stack, jsii.String("AuditBus"), jsii.String("arn:aws:events:eu-west-1:111111111111:event-bus/audit")),
		Source: "com.example.orders",
	})
	ob := infra.NewOutbox(stack, "Outbox", &infra.OutboxProps{RelayCodeDir: assetDir(t, "relay"), Network: network, Database: db, UseDatabaseSecret: true,
		LogicalTopics: []string{"orders"}, Destinations: map[string]infra.Destination{"payments": msk, "clicks": kin, "audit": eb}})
	infra.NewConsumer(stack, "ClicksConsumer", &infra.ConsumerProps{Name: "clicks", CodeDir: assetDir(t, "consumer"), Source: kin, Network: network, Database: db,
		UseDatabaseSecret: true, BatchSize: 500, Stream: infra.StreamSourceSettings{ParallelizationFactor: 4, RetryAttempts: 3}})
	infra.NewConsumer(stack, "AuditConsumer", &infra.ConsumerProps{Name: "audit", CodeDir: assetDir(t, "consumer"), Source: eb, Network: network, Database: db,
		UseDatabaseSecret: true, DetailTypes: []string{"OrderCreated"}})
	tmpl := assertions.Template_FromStack(stack, nil)

	relay := resources(tmpl, "AWS::Lambda::Function")[*stack.GetLogicalId(ob.Relay().Node().DefaultChild().(awscdk.CfnElement))]
	e := env(relay)
	topics := fmt.Sprint(e[lambdaenv.TopicARNs])
	for _, want := range []string{`"payments":"kafka://payments"`, `"clicks":"arn:aws:kinesis:eu-west-1:111111111111:stream/clicks"`,
		`"audit":"arn:aws:events:eu-west-1:111111111111:event-bus/audit"`, `"orders":"`} {
		require.Contains(t, topics, want)
	}
	require.NotContains(t, e, lambdaenv.DefaultTopicARN, "LogicalTopics without DefaultToTopic: unknown topics are quarantined")
	require.Equal(t, "b-1.payments.kafka.eu-west-1.amazonaws.com:9098,b-2.payments.kafka.eu-west-1.amazonaws.com:9098", e[lambdaenv.KafkaBrokers])
	require.Equal(t, "4194304", e["SLUICE_KAFKA_MAX_MESSAGE_BYTES"])
	require.Equal(t, "com.example.orders", e[lambdaenv.EventBridgeSource])
	tmpl.ResourceCountIs(jsii.String("Custom::AWS"), jsii.Number(0)) // brokers given
	tmpl.HasResourceProperties(jsii.String("AWS::MSK::Topic"), map[string]any{
		"ClusterArn": cluster, "TopicName": "payments", "PartitionCount": 12.0, "ReplicationFactor": 3.0,
	})
	tmpl.HasResourceProperties(jsii.String("AWS::EC2::SecurityGroupIngress"), map[string]any{"GroupId": "sg-0aaaaaaaaaaaaaaaa", "FromPort": 9098.0})
	relayGrants := statements(tmpl, refID(props(relay)["Role"]))
	require.Equal(t, "arn:aws:kafka:eu-west-1:111111111111:topic/payments/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9-2/payments",
		resolveJoin(relayGrants["kafka-cluster:WriteData"][0]["Resource"]), "the topic ARN, from the cluster's")
	require.Equal(t, "arn:aws:events:eu-west-1:111111111111:event-bus/audit", relayGrants["events:PutEvents"][0]["Resource"])
	tmpl.ResourceCountIs(jsii.String("AWS::Events::EventBusPolicy"), jsii.Number(0)) // an imported bus keeps its policy

	tmpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
		"EventSourceArn": "arn:aws:kinesis:eu-west-1:111111111111:stream/clicks", "BatchSize": 500.0, "ParallelizationFactor": 4.0, "MaximumRetryAttempts": 3.0,
	})
	tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{
		"EventBusName": "audit", "EventPattern": map[string]any{"source": []any{"com.example.orders"}, "detail-type": []any{"OrderCreated"}},
	})
	// Each consumer knows its source's last attempt: the stream mapping's retries + 1, the
	// queue's maxReceiveCount (an EventBridge source's queue).
	attempts := map[string][2]any{}
	for _, fn := range resources(tmpl, "AWS::Lambda::Function") {
		if e := env(fn); e[lambdaenv.ConsumerName] != nil {
			attempts[e[lambdaenv.ConsumerName].(string)] = [2]any{e[lambdaenv.ConsumerStreamMaxAttempts], e[lambdaenv.ConsumerMaxReceiveCount]}
		}
	}
	require.Equal(t, map[string][2]any{"clicks": {"4", nil}, "audit": {nil, "5"}}, attempts)
}

// resolveJoin evaluates the Fn::Join/Select/Split of a literal ARN, as CloudFormation would.
func resolveJoin(v any) string {
	var eval func(v any) any
	eval = func(v any) any {
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		if j, ok := m["Fn::Join"].([]any); ok {
			var parts []string
			for _, p := range j[1].([]any) {
				parts = append(parts, fmt.Sprint(eval(p)))
			}
			return strings.Join(parts, j[0].(string))
		}
		if s, ok := m["Fn::Select"].([]any); ok {
			list := eval(s[1])
			return list.([]string)[int(s[0].(float64))]
		}
		if s, ok := m["Fn::Split"].([]any); ok {
			return strings.Split(fmt.Sprint(eval(s[1])), s[0].(string))
		}
		return v
	}
	return fmt.Sprint(eval(v))
}

// Bad destination props fail synthesis naming every problem.
func TestDestinationValidation(t *testing.T) {
	app := awscdk.NewApp(nil)
	stack := awscdk.NewStack(app, jsii.String("BadDest"), nil)
	vpc := awsec2.Vpc_FromVpcAttributes(stack, jsii.String("Vpc"), &awsec2.VpcAttributes{
		VpcId: jsii.String("vpc-0123456789abcdef0"), AvailabilityZones: jsii.Strings("eu-west-1a"), PrivateSubnetIds: jsii.Strings("subnet-a"),
	})
	secret := awssecretsmanager.Secret_FromSecretCompleteArn(stack, jsii.String("Secret"), jsii.String("arn:aws:secretsmanager:eu-west-1:111111111111:secret:db-AbCdEf"))
	network, db := infra.Network{Vpc: vpc}, infra.Database{Secret: secret, CABundle: caBundle(t)}
	code := assetDir(t, "fn")
	topic := awssns.NewTopic(stack, jsii.String("Topic"), nil)
	kin := infra.NewKinesisDestination(stack, "Stream", &infra.KinesisDestinationProps{})
	eb := infra.NewEventBridgeDestination(stack, "Bus", &infra.EventBridgeDestinationProps{})
	eb2 := infra.NewEventBridgeDestination(stack, "Bus2", &infra.EventBridgeDestinationProps{Source: "other"})
	msk := infra.NewMskDestination(stack, "Kafka", &infra.MskDestinationProps{Topic: "t", Network: network})
	msk2 := infra.NewMskDestination(stack, "Kafka2", &infra.MskDestinationProps{Topic: "u", Network: network})
	consumer := func(mod func(*infra.ConsumerProps)) func(id string) {
		return func(id string) {
			p := &infra.ConsumerProps{Name: "c", CodeDir: code, Source: kin, Network: network, Database: db, UseDatabaseSecret: true}
			mod(p)
			infra.NewConsumer(stack, id, p)
		}
	}
	outbox := func(mod func(*infra.OutboxProps)) func(id string) {
		return func(id string) {
			p := &infra.OutboxProps{RelayCodeDir: code, Network: network, Database: db, UseDatabaseSecret: true}
			mod(p)
			infra.NewOutbox(stack, id, p)
		}
	}
	for _, tc := range []struct {
		name  string
		build func(id string)
		want  []string
	}{
		{"an EventBridge source AWS reserves", func(id string) {
			infra.NewEventBridgeDestination(stack, id, &infra.EventBridgeDestinationProps{Source: "aws.orders", Publishers: []string{"me"}})
		}, []string{`Source "aws.orders" must be`, `Publishers[0] "me" is not an ARN`}},
		{"a stream shaped and imported", func(id string) {
			infra.NewKinesisDestination(stack, id, &infra.KinesisDestinationProps{Stream: kin.Stream(), ShardCount: -1, Retention: 48 * time.Hour})
		}, []string{"leave them unset with Stream", "ShardCount must be between 1 and 10000, or 0 for on-demand capacity, got -1"}},
		{"a Kafka topic on MSK Serverless created by the stack", func(id string) {
			infra.NewMskDestination(stack, id, &infra.MskDestinationProps{Topic: "bad topic", Network: network, Partitions: 3})
		}, []string{`Topic "bad topic" must be`, "MSK's topic API, which does not serve MSK Serverless"}},
		{"an MSK cluster neither named nor placed", func(id string) {
			infra.NewMskDestination(stack, id, &infra.MskDestinationProps{Topic: "t", BootstrapBrokers: "b-1:9098,nope"})
		}, []string{"a new MSK Serverless cluster needs Network: Network.Vpc is required", `BootstrapBrokers: "nope" is not host:port`}},
		{"a consumer with a topic and a source", consumer(func(p *infra.ConsumerProps) {
			p.Topic, p.Fifo, p.DetailTypes = topic, true, []string{"X"}
		}), []string{"Topic and Source exclude each other", "Fifo needs a FIFO SNS topic", "DetailTypes filters an EventBridge rule"}},
		{"stream settings on a bus", consumer(func(p *infra.ConsumerProps) {
			p.Source, p.Stream = eb, infra.StreamSourceSettings{RetryAttempts: 20000, ParallelizationFactor: 2}
		}), []string{"Stream tunes a Kinesis or MSK source's event source mapping", "Stream.RetryAttempts must be between 0 and 10000, got 20000",
			"Stream.ParallelizationFactor is Kinesis's"}},
		{"pollers out of range, and a group name Lambda refuses", consumer(func(p *infra.ConsumerProps) {
			p.Source, p.Name, p.Stream = msk, "a b", infra.StreamSourceSettings{MinPollers: 300}
		}), []string{"Stream.MinPollers (1..200) and MaxPollers (MinPollers..2000) must hold, got 300 and 5", `makes the Kafka consumer group "sluice-a b"`}},
		{"one relay, two sources and two clusters", outbox(func(p *infra.OutboxProps) {
			p.Destinations = map[string]infra.Destination{"a": eb, "b": eb2, "c": msk, "d": msk2}
		}), []string{"the EventBridge destinations have different Sources [other sluice]", "the MSK destinations are on 2 clusters"}},
		{"a name routed twice, two defaults", outbox(func(p *infra.OutboxProps) {
			p.LogicalTopics, p.Destinations, p.DefaultDestination, p.DefaultToTopic = []string{"a"}, map[string]infra.Destination{"a": kin}, kin, true
		}), []string{`logical topic "a" is both in LogicalTopics and Destinations`, "DefaultDestination and DefaultToTopic exclude each other"}},
		{"an example stack on an unknown broker", func(id string) {
			infra.NewSluiceStack(app, id, &infra.SluiceStackProps{Destination: "sqs", MskTopic: "t", Fifo: true, NoAlarmDestination: true})
		}, []string{`Destination "sqs" must be sns, eventbridge, kinesis or msk`, "MskClusterArn, MskSecurityGroupID and MskTopic need Destination msk",
			"Fifo makes an SNS FIFO topic"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						err, _ = r.(error)
						require.NotNil(t, err, "panic value %v is not an error", r)
					}
				}()
				tc.build(strings.ReplaceAll(tc.name, " ", ""))
			}()
			require.Error(t, err, "no validation error")
			require.Contains(t, err.Error(), "invalid props")
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// A stack whose every destination is another kind creates no SNS topic for the outbox (only
// the alarms' topic), and its relay gets no SNS permission (issue 21, item 9).
func TestNoOutboxTopicWithoutSNSDestinations(t *testing.T) {
	for _, kind := range []string{infra.DestinationEventBridge, infra.DestinationKinesis} {
		s, tmpl := destinationStack(t, kind)
		require.Nil(t, s.Outbox().Topic(), "%s", kind)
		for id, topic := range resources(tmpl, "AWS::SNS::Topic") {
			require.Equal(t, "sluice alarms", props(topic)["DisplayName"], "%s: %s is the alarms' topic", kind, id)
		}
		relay := resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(s.Outbox().Relay().Node().DefaultChild().(awscdk.CfnElement))]
		require.NotContains(t, roleActions(tmpl, relay), "sns:Publish", "%s", kind)
	}
}
