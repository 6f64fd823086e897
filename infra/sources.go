package infra

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/jsii-runtime-go"
	sluiceoutbox "github.com/sluicehq/sluice/pkg/outbox"
)

// StreamSourceSettings tune the event source mapping of a consumer whose Source is a Kinesis
// stream or an MSK topic. The mapping always reports batch item failures (the consumer marks
// a record failed only when its transaction did not commit) and bisects a batch on a function
// error, so a poison record is isolated; after RetryAttempts the failing records' failure
// record (stream, shard or partition, sequence numbers or offsets, not the data) goes to
// DeadLetterQueue and the mapping moves on: re-read the records from the stream within its
// retention (docs/destinations.md). ConsumerProps.BatchSize (1..10000) and MaxBatchingWindow
// apply; MaxConcurrency becomes the function's reserved concurrency.
type StreamSourceSettings struct {
	// StartingPosition is where a new mapping starts reading. Defaults to TRIM_HORIZON:
	// everything the stream or topic still holds, so nothing published before the first deploy
	// of the consumer is skipped.
	StartingPosition awslambda.StartingPosition
	// RetryAttempts is how many times a failing batch is retried before its failure record goes
	// to DeadLetterQueue, 0 to 10000. Defaults to 10 (with a failure destination, Lambda caps a
	// Kafka mapping's "infinite" at 10 anyway).
	RetryAttempts int
	// MaxRecordAge sends records older than this to DeadLetterQueue instead of retrying them,
	// between 1 minute and 7 days. Defaults to 0: as long as the stream retains them.
	MaxRecordAge time.Duration
	// ParallelizationFactor is how many batches of one Kinesis shard are processed at once, 1
	// to 10; the records of one partition key stay in order at any factor. Kinesis only.
	// Defaults to 1.
	ParallelizationFactor int
	// MinPollers and MaxPollers size an MSK mapping's provisioned mode, which Lambda requires
	// for a Kafka mapping's retry, bisect and partial batch response controls (each poller is
	// billed by the hour). MSK only. Default to 1 and MaxConcurrency.
	MinPollers, MaxPollers int
}

// kafkaGroupPattern is what Lambda accepts as a Kafka consumer group id.
var kafkaGroupPattern = regexp.MustCompile(`^[a-zA-Z0-9\-/*:_+=.@]{1,200}$`)

func (p *ConsumerProps) sourceKind() sluiceoutbox.Kind {
	if p.Source == nil {
		return sluiceoutbox.SNS
	}
	return p.Source.Kind()
}

// streamSource reports whether the consumer reads a stream or topic itself (Kinesis, MSK).
func (p *ConsumerProps) streamSource() bool {
	k := p.sourceKind()
	return k == sluiceoutbox.Kinesis || k == sluiceoutbox.Kafka
}

// streamConcurrency is the function's reserved concurrency: MaxConcurrency for a stream source,
// none for a queue (its mapping's MaxConcurrency caps it).
func (p *ConsumerProps) streamConcurrency() int {
	if p.streamSource() {
		return p.MaxConcurrency
	}
	return 0
}

// defaultStreamRetryAttempts is StreamSourceSettings.RetryAttempts's default.
const defaultStreamRetryAttempts = 10

// streamRetryAttempts is the stream mapping's MaximumRetryAttempts: Stream.RetryAttempts or its
// default.
func (p *ConsumerProps) streamRetryAttempts() int {
	return orDefault(p.Stream.RetryAttempts, defaultStreamRetryAttempts)
}

// kafkaGroupID is the consumer's Kafka consumer group: one per inbox consumer, so that two
// consumers each read every record.
func (p *ConsumerProps) kafkaGroupID() string { return "sluice-" + p.Name }

func (p *ConsumerProps) validateSource() []error {
	var errs []error
	if p.Source == nil {
		return []error{errors.New("Topic (or Source) is required")}
	}
	if p.Topic != nil {
		errs = append(errs, errors.New("Topic and Source exclude each other: the consumer reads one"))
	}
	if p.Fifo {
		errs = append(errs, errors.New("Fifo needs a FIFO SNS topic: an EventBridge, Kinesis or MSK source delivers no message groups"))
	}
	if len(p.FilterPolicy) > 0 {
		errs = append(errs, errors.New("FilterPolicy filters an SNS subscription: use DetailTypes for an EventBridge source"))
	}
	if len(p.DetailTypes) > 0 && p.sourceKind() != sluiceoutbox.EventBridge {
		errs = append(errs, errors.New("DetailTypes filters an EventBridge rule: the source is no EventBridge bus"))
	}
	s := p.Stream
	if s != (StreamSourceSettings{}) && !p.streamSource() {
		errs = append(errs, errors.New("Stream tunes a Kinesis or MSK source's event source mapping: the source is neither"))
	}
	if s.RetryAttempts < 0 || s.RetryAttempts > 10000 {
		errs = append(errs, fmt.Errorf("Stream.RetryAttempts must be between 0 and 10000, got %d", s.RetryAttempts))
	}
	if s.MaxRecordAge != 0 && (s.MaxRecordAge < time.Minute || s.MaxRecordAge > 7*24*time.Hour) {
		errs = append(errs, fmt.Errorf("Stream.MaxRecordAge must be between 1m and 7 days, got %s", s.MaxRecordAge))
	}
	if s.ParallelizationFactor < 0 || s.ParallelizationFactor > 10 {
		errs = append(errs, fmt.Errorf("Stream.ParallelizationFactor must be between 1 and 10, got %d", s.ParallelizationFactor))
	}
	if s.ParallelizationFactor > 0 && p.sourceKind() != sluiceoutbox.Kinesis {
		errs = append(errs, errors.New("Stream.ParallelizationFactor is Kinesis's: the source is no Kinesis stream"))
	}
	if (s.MinPollers != 0 || s.MaxPollers != 0) && p.sourceKind() != sluiceoutbox.Kafka {
		errs = append(errs, errors.New("Stream.MinPollers and MaxPollers are an MSK mapping's: the source is no MSK topic"))
	}
	if minP, maxP := orDefault(s.MinPollers, 1), orDefault(s.MaxPollers, p.MaxConcurrency); s.MinPollers < 0 || minP > 200 || maxP < minP || maxP > 2000 {
		errs = append(errs, fmt.Errorf("Stream.MinPollers (1..200) and MaxPollers (MinPollers..2000) must hold, got %d and %d", minP, maxP))
	}
	if p.sourceKind() == sluiceoutbox.Kafka && !kafkaGroupPattern.MatchString(p.kafkaGroupID()) {
		errs = append(errs, fmt.Errorf("Name %q makes the Kafka consumer group %q, which Lambda refuses (letters, digits and -/*:_+=.@, up to 200)", p.Name, p.kafkaGroupID()))
	}
	return errs
}

// subscribeBus sends the bus's events of the relay's Source to the queue with an EventBridge
// rule: the target delivers each event as it is (detail-type, source, and detail, the relay's
// envelope, wire.Envelope), which inbox.Parse recognises, and what it cannot deliver after its
// retries goes to SubscriptionDeadLetterQueue. The queue
// and key policies are written by hand, as for SNS: events.amazonaws.com may send and use the
// key for this rule only (aws:SourceArn), nobody else but the redrivers may send.
func (c *consumer) subscribeBus(p *ConsumerProps) {
	d := p.Source.(*eventBridgeDestination)
	stack := awscdk.Stack_Of(c)
	name := awscdk.Names_UniqueResourceName(c, &awscdk.UniqueResourceNameOptions{MaxLength: jsii.Number(64), Separator: jsii.String("-")})
	// The rule's ARN, formatted rather than read from the rule: the key policy names it, and the
	// rule depends on the queue, which depends on the key.
	ruleArn := stack.FormatArn(&awscdk.ArnComponents{Service: jsii.String("events"), Resource: jsii.String("rule"),
		ResourceName: jsii.String(*d.bus.EventBusName() + "/" + *name)})
	if *d.bus.EventBusName() == "default" {
		ruleArn = stack.FormatArn(&awscdk.ArnComponents{Service: jsii.String("events"), Resource: jsii.String("rule"), ResourceName: name})
	}
	c.ruleArn = ruleArn
	fromRule := &map[string]any{"ArnEquals": map[string]any{"aws:SourceArn": ruleArn}}
	events := awsiam.NewServicePrincipal(jsii.String("events.amazonaws.com"), nil)
	queuePolicy := c.queue.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("RuleDelivers"),
		Principals: &[]awsiam.IPrincipal{events},
		Actions:    jsii.Strings("sqs:SendMessage"),
		Resources:  &[]*string{c.queue.QueueArn()},
		Conditions: fromRule,
	}))
	dlqPolicy := c.subDLQ.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("RuleDeadLetters"),
		Principals: &[]awsiam.IPrincipal{events},
		Actions:    jsii.Strings("sqs:SendMessage"),
		Resources:  &[]*string{c.subDLQ.QueueArn()},
		Conditions: fromRule,
	}))
	redrivers := []any{}
	for _, a := range p.Redrivers {
		redrivers = append(redrivers, a)
	}
	notFromRule := map[string]any{"ArnNotEquals": map[string]any{"aws:SourceArn": ruleArn}}
	if len(redrivers) > 0 {
		notFromRule["ArnNotEquals"] = map[string]any{"aws:SourceArn": ruleArn, "aws:PrincipalArn": redrivers}
	}
	c.queue.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("OnlyTheRuleAndRedriversSend"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("sqs:SendMessage"),
		Resources:  &[]*string{c.queue.QueueArn()},
		Conditions: &notFromRule,
	}))
	c.queueKey.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("RuleEncryptsForTheQueues"),
		Principals: &[]awsiam.IPrincipal{events},
		Actions:    jsii.Strings("kms:Decrypt", "kms:GenerateDataKey*"),
		Resources:  jsii.Strings("*"),
		Conditions: fromRule,
	}), nil)

	pattern := map[string]any{"source": []string{d.source}}
	if len(p.DetailTypes) > 0 {
		pattern["detail-type"] = p.DetailTypes
	}
	c.rule = awsevents.NewCfnRule(c, jsii.String("Rule"), &awsevents.CfnRuleProps{
		Name:         name,
		Description:  jsii.String("sluice: the relay's events to consumer " + p.Name + "'s queue"),
		EventBusName: d.bus.EventBusName(),
		EventPattern: pattern,
		State:        jsii.String("ENABLED"),
		Targets: []any{&awsevents.CfnRule_TargetProperty{
			Id:               jsii.String("Queue"),
			Arn:              c.queue.QueueArn(),
			DeadLetterConfig: &awsevents.CfnRule_DeadLetterConfigProperty{Arn: c.subDLQ.QueueArn()},
			// EventBridge's own limits, stated: a day of retries with backoff.
			RetryPolicy: &awsevents.CfnRule_RetryPolicyProperty{MaximumRetryAttempts: jsii.Number(185), MaximumEventAgeInSeconds: jsii.Number(86400)},
		}},
	})
	for _, pol := range []*awsiam.AddToResourcePolicyResult{queuePolicy, dlqPolicy} {
		if pol.PolicyDependable != nil {
			c.rule.Node().AddDependency(pol.PolicyDependable)
		}
	}
}

// addStreamSource reads the Kinesis stream or MSK topic with an event source mapping that
// reports batch item failures, bisects on error, retries a bounded number of times and sends
// failure records to DeadLetterQueue.
func (c *consumer) addStreamSource(p *ConsumerProps) {
	s := p.Stream
	start := s.StartingPosition
	if start == "" {
		start = awslambda.StartingPosition_TRIM_HORIZON
	}
	retries := jsii.Number(float64(p.streamRetryAttempts()))
	var window, maxAge awscdk.Duration
	if p.MaxBatchingWindow > 0 {
		window = seconds(p.MaxBatchingWindow)
	}
	if s.MaxRecordAge > 0 {
		maxAge = seconds(s.MaxRecordAge)
	}
	onFailure := awslambdaeventsources.NewSqsDlq(c.dlq)
	suppress(c.dlq, "AwsSolutions-SQS3",
		"This queue is the event source mapping's on-failure destination: it receives the failure records of what "+
			"kept failing (the mapping's DestinationConfig names it); cdk-nag only recognises DLQs of other queues. It is alarmed on.")
	suppress(c.fn, "AwsSolutions-IAM5",
		"The mapping sends failure records to the KMS-encrypted DeadLetterQueue as the function's role: SqsDlq grants "+
			"sqs:SendMessage with kms:GenerateDataKey* and kms:ReEncrypt* (their variants) on the queue key's ARN only.",
		"Action::kms:GenerateDataKey*", "Action::kms:ReEncrypt*")
	switch d := p.Source.(type) {
	case *kinesisDestination:
		c.fn.AddEventSource(awslambdaeventsources.NewKinesisEventSource(d.stream, &awslambdaeventsources.KinesisEventSourceProps{
			StartingPosition:        start,
			BatchSize:               jsii.Number(float64(p.BatchSize)),
			MaxBatchingWindow:       window,
			BisectBatchOnError:      jsii.Bool(true),
			ReportBatchItemFailures: jsii.Bool(true),
			RetryAttempts:           retries,
			MaxRecordAge:            maxAge,
			ParallelizationFactor:   jsii.Number(float64(orDefault(s.ParallelizationFactor, 1))),
			OnFailure:               onFailure,
		}))
	case *mskDestination:
		c.fn.AddEventSource(awslambdaeventsources.NewManagedKafkaEventSource(&awslambdaeventsources.ManagedKafkaEventSourceProps{
			ClusterArn:              d.clusterArn,
			Topic:                   jsii.String(d.topic),
			ConsumerGroupId:         jsii.String(p.kafkaGroupID()),
			StartingPosition:        start,
			BatchSize:               jsii.Number(float64(p.BatchSize)),
			MaxBatchingWindow:       window,
			BisectBatchOnError:      jsii.Bool(true),
			ReportBatchItemFailures: jsii.Bool(true),
			RetryAttempts:           retries,
			MaxRecordAge:            maxAge,
			OnFailure:               onFailure,
			ProvisionedPollerConfig: &awslambdaeventsources.ProvisionedPollerConfig{
				MinimumPollers: jsii.Number(float64(orDefault(s.MinPollers, 1))),
				MaximumPollers: jsii.Number(float64(orDefault(s.MaxPollers, p.MaxConcurrency))),
			},
		}))
		// MSK IAM access control: the mapping polls as the function's role.
		c.fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions:   jsii.Strings("kafka-cluster:Connect", "kafka-cluster:DescribeClusterDynamicConfiguration"),
			Resources: &[]*string{d.clusterArn},
		}))
		c.fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions:   jsii.Strings("kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"),
			Resources: &[]*string{kafkaResourceArn(d.clusterArn, "topic", d.topic)},
		}))
		c.fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions:   jsii.Strings("kafka-cluster:DescribeGroup", "kafka-cluster:AlterGroup"),
			Resources: &[]*string{kafkaResourceArn(d.clusterArn, "group", p.kafkaGroupID())},
		}))
		suppress(c.fn, "AwsSolutions-IAM4",
			"AWSLambdaMSKExecutionRole is what CDK's MSK event source attaches: the mapping's poller describes the cluster, "+
				"reads its bootstrap brokers and manages its ENIs in the cluster's subnets (EC2 actions exist only on Resource *); "+
				"the Kafka data-plane permissions are scoped statements on the cluster, topic and group.",
			"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaMSKExecutionRole")
	}
}

// sourceAlarms adds the alarms and graphs particular to a consumer's source: the EventBridge
// rule's failed invocations, the Kinesis mapping's iterator age, the MSK mapping's offset lag.
func sourceAlarms(c Consumer, p *MonitoringProps, alarm func(key, description string, metric awscloudwatch.IMetric, threshold float64, periods int)) []awscloudwatch.IMetric {
	n := c.Name()
	fn := c.Function()
	switch {
	case c.Rule() != nil:
		dims := map[string]*string{"RuleName": c.Rule().Name()}
		if bus := c.Source().(*eventBridgeDestination).bus.EventBusName(); *bus != "default" {
			dims["EventBusName"] = bus
		}
		failed := awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace: jsii.String("AWS/Events"), MetricName: jsii.String("FailedInvocations"), DimensionsMap: &dims,
			Statistic: jsii.String("Sum"), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		})
		alarm(n+"/RuleFailedInvocations", fmt.Sprintf("Consumer %s: EventBridge could not deliver events to the queue (they go to the subscription DLQ after the retries).", n),
			failed, 0, 1)
		return []awscloudwatch.IMetric{failed}
	case c.Source() != nil && c.Source().Kind() == sluiceoutbox.Kinesis:
		age := fn.Metric(jsii.String("IteratorAge"), &awscloudwatch.MetricOptions{Statistic: jsii.String("Maximum"), Period: awscdk.Duration_Minutes(jsii.Number(1))})
		alarm(n+"/IteratorAge", fmt.Sprintf("Consumer %s: the Kinesis mapping's newest batch was written over %s ago: the consumer falls behind the stream.", n, p.IteratorAge),
			age, float64(p.IteratorAge.Milliseconds()), 3)
		return []awscloudwatch.IMetric{age}
	case c.Source() != nil && c.Source().Kind() == sluiceoutbox.Kafka:
		lag := fn.Metric(jsii.String("OffsetLag"), &awscloudwatch.MetricOptions{Statistic: jsii.String("Maximum"), Period: awscdk.Duration_Minutes(jsii.Number(1))})
		alarm(n+"/OffsetLag", fmt.Sprintf("Consumer %s: the MSK mapping is over %g records behind the topic.", n, p.OffsetLag),
			lag, p.OffsetLag, 5)
		return []awscloudwatch.IMetric{lag}
	}
	return nil
}
