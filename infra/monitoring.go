package infra

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsrds"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssnssubscriptions"
	"github.com/aws/aws-cdk-go/awscdk/v2/interfaces/interfacesawscloudwatch"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/pkg/metrics"
)

// MonitoringProps configure Monitoring.
type MonitoringProps struct {
	// Outbox is the outbox to watch. Optional.
	Outbox Outbox
	// Fleet is the outbox fleet to watch: the relay alarms over the aggregate of its tenants
	// (Metrics Insights queries over the {Service=relay, Tenant} series, keys prefixed
	// "Fleet"), FleetTenantsFailing, a missing fleet heartbeat, and each shard's Lambda errors
	// and throttles ("FleetShard0RelayErrors", ...). Optional.
	Fleet OutboxFleet
	// FleetTenantsFailingMinutes is how many consecutive minutes with a failing tenant
	// (FleetTenantsFailing > 0) raise the FleetTenantsFailing alarm. Defaults to 5.
	FleetTenantsFailingMinutes int
	// Consumers are the consumers to watch. Optional.
	Consumers []Consumer
	// Migrations adds the alarm on its function's errors: the scheduled partition maintenance
	// failing (a failed migration fails the deploy instead). Optional.
	Migrations Migrations
	// AlarmTopic receives every alarm's ALARM and OK notifications. Defaults to a new
	// KMS-encrypted topic that CloudWatch may publish to.
	AlarmTopic awssns.ITopic
	// AlarmEmail, when set, subscribes this address to the alarm topic (confirm the e-mail AWS sends).
	AlarmEmail string
	// NoAlarmDestination deploys the alarms with nobody to tell (no AlarmTopic, no AlarmEmail),
	// e.g. for a test stack; synthesis warns. Without it, a missing destination fails synthesis.
	NoAlarmDestination bool
	// Database adds the database's alarms. Optional.
	Database *DatabaseAlarms
	// DashboardName is the CloudWatch dashboard's name. Defaults to a generated name.
	DashboardName string

	// OldestPendingAge is the outbox oldest-pending-age alarm threshold. Defaults to 5 minutes.
	OldestPendingAge time.Duration
	// HeartbeatMissingMinutes is how many consecutive minutes without a relay heartbeat raise the
	// heartbeat alarm. Defaults to 3.
	HeartbeatMissingMinutes int
	// QueueOldestMessageAge is the consumer queues' age-of-oldest-message alarm threshold.
	// Defaults to 5 minutes.
	QueueOldestMessageAge time.Duration
	// IteratorAge is the Kinesis consumers' iterator-age alarm threshold: how old the newest
	// batch the mapping read was. Defaults to 5 minutes.
	IteratorAge time.Duration
	// OffsetLag is the MSK consumers' offset-lag alarm threshold (records behind the topic).
	// Defaults to 10,000.
	OffsetLag float64
	// LambdaErrors alarms when a Lambda's errors in 5 minutes exceed it. Defaults to 0 (any error).
	LambdaErrors float64
	// LambdaThrottles alarms when a Lambda's throttles in 5 minutes exceed it. Defaults to 0 (any throttle).
	LambdaThrottles float64
}

// DatabaseAlarms configure the alarms on the RDS instance.
type DatabaseAlarms struct {
	// Instance is the RDS PostgreSQL instance. Required.
	Instance awsrds.IDatabaseInstance
	// MaxConnections is the instance's max_connections. Required.
	MaxConnections int
	// CPUPercent alarms when the CPU stays above it for 15 minutes. Defaults to 80.
	CPUPercent float64
	// FreeableMemoryBytes alarms when freeable memory stays below it for 15 minutes. Defaults
	// to 200 MiB (10% of the default t4g.small's 2 GiB).
	FreeableMemoryBytes float64
	// FreeStorageBytes alarms when free storage falls below it. Defaults to 2 GiB (10% of the
	// example's 20 GiB; storage autoscaling grows the volume up to its maximum at about the same
	// point, so the alarm that stays raised means the maximum is near).
	FreeStorageBytes float64
	// ConnectionsPercent alarms when connections exceed this share of MaxConnections for 5
	// minutes. Defaults to 80.
	ConnectionsPercent float64
	// MaximumUsedTransactionIDs alarms when the oldest unfrozen transaction ID is this old
	// (wraparound stops writes at about 2.1 billion). Defaults to 1,000,000,000.
	MaximumUsedTransactionIDs float64
	// ReplicationSlotLagBytes, when set, alarms when a replication slot holds back more WAL than
	// this (RDS's OldestReplicationSlotLag) for 5 minutes: a slot nobody reads fills the disk.
	// Defaults to 0: no alarm (the example stack sets it when the relay follows the WAL).
	ReplicationSlotLagBytes float64
}

// Monitoring holds the sluice alarms and dashboard.
type Monitoring interface {
	constructs.IConstruct
	// AlarmTopic receives the alarm notifications.
	AlarmTopic() awssns.ITopic
	// Alarms are all alarms, keyed by a stable name such as "RelayHeartbeatMissing" or
	// "orders/DeadLetterQueueNotEmpty".
	Alarms() map[string]awscloudwatch.Alarm
	// Dashboard is the CloudWatch dashboard.
	Dashboard() awscloudwatch.Dashboard
}

type monitoring struct {
	constructs.Construct
	topic     awssns.ITopic
	alarms    map[string]awscloudwatch.Alarm
	dashboard awscloudwatch.Dashboard
}

func (m *monitoring) AlarmTopic() awssns.ITopic              { return m.topic }
func (m *monitoring) Alarms() map[string]awscloudwatch.Alarm { return m.alarms }
func (m *monitoring) Dashboard() awscloudwatch.Dashboard     { return m.dashboard }

func (p *MonitoringProps) withDefaults() MonitoringProps {
	out := *p
	out.OldestPendingAge = orDefault(out.OldestPendingAge, 5*time.Minute)
	out.HeartbeatMissingMinutes = orDefault(out.HeartbeatMissingMinutes, 3)
	out.FleetTenantsFailingMinutes = orDefault(out.FleetTenantsFailingMinutes, 5)
	out.QueueOldestMessageAge = orDefault(out.QueueOldestMessageAge, 5*time.Minute)
	out.IteratorAge = orDefault(out.IteratorAge, 5*time.Minute)
	out.OffsetLag = orDefault(out.OffsetLag, 10000)
	if d := out.Database; d != nil {
		dd := *d
		dd.CPUPercent = orDefault(dd.CPUPercent, 80)
		dd.FreeableMemoryBytes = orDefault(dd.FreeableMemoryBytes, 200*1024*1024)
		dd.FreeStorageBytes = orDefault(dd.FreeStorageBytes, 2*1024*1024*1024)
		dd.ConnectionsPercent = orDefault(dd.ConnectionsPercent, 80)
		dd.MaximumUsedTransactionIDs = orDefault(dd.MaximumUsedTransactionIDs, 1e9)
		out.Database = &dd
	}
	return out
}

func (p *MonitoringProps) validate() error {
	var errs []error
	if p.OldestPendingAge < 0 {
		errs = append(errs, fmt.Errorf("OldestPendingAge must not be negative, got %s", p.OldestPendingAge))
	}
	if p.HeartbeatMissingMinutes < 0 {
		errs = append(errs, fmt.Errorf("HeartbeatMissingMinutes must not be negative, got %d", p.HeartbeatMissingMinutes))
	}
	if p.FleetTenantsFailingMinutes < 0 {
		errs = append(errs, fmt.Errorf("FleetTenantsFailingMinutes must not be negative, got %d", p.FleetTenantsFailingMinutes))
	}
	if p.QueueOldestMessageAge < 0 {
		errs = append(errs, fmt.Errorf("QueueOldestMessageAge must not be negative, got %s", p.QueueOldestMessageAge))
	}
	if p.IteratorAge < 0 || p.OffsetLag < 0 {
		errs = append(errs, fmt.Errorf("IteratorAge and OffsetLag must not be negative, got %s and %g", p.IteratorAge, p.OffsetLag))
	}
	if p.LambdaErrors < 0 {
		errs = append(errs, fmt.Errorf("LambdaErrors must not be negative, got %g", p.LambdaErrors))
	}
	if p.LambdaThrottles < 0 {
		errs = append(errs, fmt.Errorf("LambdaThrottles must not be negative, got %g", p.LambdaThrottles))
	}
	for i, c := range p.Consumers {
		if c == nil {
			errs = append(errs, fmt.Errorf("Consumers[%d] is nil", i))
		}
	}
	if p.AlarmTopic == nil && p.AlarmEmail == "" && !p.NoAlarmDestination {
		errs = append(errs, errors.New("the alarms need a destination: set AlarmEmail, AlarmTopic (an existing topic with subscribers), "+
			"or NoAlarmDestination to deploy alarms that reach nobody"))
	}
	if d := p.Database; d != nil {
		if d.Instance == nil {
			errs = append(errs, errors.New("Database.Instance is required"))
		}
		if d.MaxConnections < 1 {
			errs = append(errs, fmt.Errorf("Database.MaxConnections must be positive, got %d", d.MaxConnections))
		}
		if d.CPUPercent < 0 || d.CPUPercent > 100 || d.ConnectionsPercent < 0 || d.ConnectionsPercent > 100 {
			errs = append(errs, fmt.Errorf("Database.CPUPercent and ConnectionsPercent must be between 0 and 100, got %g and %g", d.CPUPercent, d.ConnectionsPercent))
		}
		if d.FreeableMemoryBytes < 0 || d.FreeStorageBytes < 0 || d.MaximumUsedTransactionIDs < 0 {
			errs = append(errs, errors.New("Database thresholds must not be negative"))
		}
	}
	if p.Outbox == nil && p.Fleet == nil && len(p.Consumers) == 0 && p.Migrations == nil {
		errs = append(errs, errors.New("nothing to monitor: set Outbox, Fleet, Consumers or Migrations"))
	}
	return errors.Join(errs...)
}

// onlyCloudWatchPublishes writes the alarm topic's policy: CloudWatch may publish for this
// account's alarms (aws:SourceAccount and aws:SourceArn, against a confused deputy), and a Deny
// refuses sns:Publish to every other principal, whatever its identity policy allows, so that
// nobody in the account sends a false alarm (or an OK hiding a real one). No principal of the
// stack publishes alarms itself: only the alarms do, through CloudWatch.
func onlyCloudWatchPublishes(topic awssns.ITopic) {
	cloudwatch := "cloudwatch.amazonaws.com"
	alarms := awscdk.Fn_Join(jsii.String(""), &[]*string{
		jsii.String("arn:"), awscdk.Aws_PARTITION(), jsii.String(":cloudwatch:"), awscdk.Aws_REGION(), jsii.String(":"), awscdk.Aws_ACCOUNT_ID(), jsii.String(":alarm:*"),
	})
	topic.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("CloudWatchAlarmsPublish"),
		Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String(cloudwatch), nil)},
		Actions:    jsii.Strings("sns:Publish"),
		Resources:  &[]*string{topic.TopicArn()},
		Conditions: &map[string]any{
			"StringEquals": map[string]any{"aws:SourceAccount": awscdk.Aws_ACCOUNT_ID()},
			"ArnLike":      map[string]any{"aws:SourceArn": alarms},
		},
	}))
	// aws:PrincipalServiceName is set only when a service principal calls: for every IAM
	// principal the negated condition holds, and the Deny applies.
	topic.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("OnlyCloudWatchPublishes"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("sns:Publish"),
		Resources:  &[]*string{topic.TopicArn()},
		Conditions: &map[string]any{"StringNotEquals": map[string]any{"aws:PrincipalServiceName": cloudwatch}},
	}))
}

// NewMonitoring creates the alarms, the alarm topic (unless given) and the dashboard. It panics
// on invalid props, naming every problem.
func NewMonitoring(scope constructs.Construct, id string, props *MonitoringProps) Monitoring {
	p := props.withDefaults()
	invalid("Monitoring", id, p.validate())

	m := &monitoring{alarms: map[string]awscloudwatch.Alarm{}}
	constructs.NewConstruct_Override(m, scope, &id) // m itself is the jsii construct, so it can be passed to CDK APIs
	this := m

	m.topic = p.AlarmTopic
	if m.topic == nil {
		key := newKey(this, "AlarmTopicKey", "sluice alarm topic encryption")
		// CloudWatch publishes alarm notifications with this key.
		key.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("AllowCloudWatchAlarms"),
			Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String("cloudwatch.amazonaws.com"), nil)},
			Actions:    jsii.Strings("kms:GenerateDataKey*", "kms:Decrypt"),
			Resources:  jsii.Strings("*"),
			Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": awscdk.Aws_ACCOUNT_ID()}},
		}), nil)
		m.topic = awssns.NewTopic(this, jsii.String("AlarmTopic"), &awssns.TopicProps{
			DisplayName: jsii.String("sluice alarms"),
			MasterKey:   key,
			EnforceSSL:  jsii.Bool(true),
		})
		onlyCloudWatchPublishes(m.topic)
	}
	if p.AlarmEmail != "" {
		m.topic.AddSubscription(awssnssubscriptions.NewEmailSubscription(jsii.String(p.AlarmEmail), nil))
	}
	if p.AlarmTopic == nil && p.AlarmEmail == "" {
		awscdk.Annotations_Of(m).AddWarningV2(jsii.String("sluice:noAlarmDestination"), jsii.String(
			"NoAlarmDestination: the sluice alarms notify a topic nobody subscribes to; subscribe to AlarmTopicArn before relying on them"), nil)
	}
	action := awscloudwatchactions.NewSnsAction(m.topic)

	alarm := func(key, description string, metric awscloudwatch.IMetric, op awscloudwatch.ComparisonOperator, threshold float64, periods int, missing awscloudwatch.TreatMissingData) {
		a := awscloudwatch.NewAlarm(this, jsii.String(strings.ReplaceAll(key, "/", "-")), &awscloudwatch.AlarmProps{
			AlarmDescription:   jsii.String(description + " Runbook: docs/deploy.md#alarms"),
			Metric:             metric,
			ComparisonOperator: op,
			Threshold:          jsii.Number(threshold),
			EvaluationPeriods:  jsii.Number(float64(periods)),
			DatapointsToAlarm:  jsii.Number(float64(periods)),
			TreatMissingData:   missing,
		})
		a.AddAlarmAction(action)
		a.AddOkAction(action)
		m.alarms[key] = a
	}
	gt := awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD
	notBreaching := awscloudwatch.TreatMissingData_NOT_BREACHING
	fiveMin := &awscloudwatch.MetricOptions{Period: awscdk.Duration_Minutes(jsii.Number(5)), Statistic: jsii.String("Sum")}
	lambdaAlarms := func(prefix, what string, fn interface {
		MetricErrors(*awscloudwatch.MetricOptions) awscloudwatch.Metric
		MetricThrottles(*awscloudwatch.MetricOptions) awscloudwatch.Metric
	}) {
		alarm(prefix+"Errors", what+" Lambda errors.", fn.MetricErrors(fiveMin), gt, p.LambdaErrors, 1, notBreaching)
		alarm(prefix+"Throttles", what+" Lambda throttles.", fn.MetricThrottles(fiveMin), gt, p.LambdaThrottles, 1, notBreaching)
	}

	dash := awscloudwatch.NewDashboard(this, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DashboardName: jsiiOrNil(p.DashboardName),
	})
	m.dashboard = dash
	graph := func(title string, left []awscloudwatch.IMetric, threshold *float64) awscloudwatch.IWidget {
		gp := &awscloudwatch.GraphWidgetProps{Title: jsii.String(title), Left: &left, Width: jsii.Number(8)}
		if threshold != nil {
			gp.LeftAnnotations = &[]*awscloudwatch.HorizontalAnnotation{{Value: threshold, Label: jsii.String("alarm")}}
		}
		return awscloudwatch.NewGraphWidget(gp)
	}

	// relayAlarms are the alarms on what an outbox's relays report (prefix "", metric
	// RelayMetric); where names the rows' databases in the descriptions. It returns the oldest
	// pending age.
	relayAlarms := func(prefix, where string, metric func(metrics.Metric, string) awscloudwatch.IMetric) awscloudwatch.IMetric {
		age := metric(metrics.OutboxOldestPendingAge, "Maximum")
		alarm(prefix+"OutboxOldestPendingAge", fmt.Sprintf("The oldest unpublished outbox row%s is older than %s: rows are committed but not published.", where, p.OldestPendingAge),
			age, gt, p.OldestPendingAge.Seconds(), 2, notBreaching)
		alarm(prefix+"OutboxQuarantined", fmt.Sprintf("Quarantined outbox rows%s: they block their partition key until retried.", where),
			metric(metrics.OutboxQuarantined, "Maximum"), gt, 0, 1, notBreaching)
		alarm(prefix+"RelayDestinationsDown", "A relay backs off a whole destination (every publish to it fails: SNS, EventBridge or Kinesis throttling, an outage, a denied key, unreachable Kafka brokers) for 5 minutes.",
			metric(metrics.DestinationsDown, "Maximum"), gt, 0, 5, notBreaching)
		alarm(prefix+"RelayOrderViolations", "A destination acknowledged a row after failing an earlier row of its key in the same call: that key's events may have been delivered out of order (the relay's error log names the rows).",
			metric(metrics.OrderViolations, "Sum"), gt, 0, 1, notBreaching)
		alarm(prefix+"OldestTransactionAge", fmt.Sprintf("A transaction%s has held a snapshot for over 10 minutes: VACUUM cannot clean up behind it and the outbox's index fills with dead entries (sluice status names it).", where),
			metric(metrics.OldestTransactionAge, "Maximum"), gt, 600, 2, notBreaching)
		return age
	}

	if o := p.Outbox; o != nil {
		age := relayAlarms("", "", func(m metrics.Metric, stat string) awscloudwatch.IMetric { return RelayMetric(m, stat) })
		alarm("RelayHeartbeatMissing", fmt.Sprintf("No relay heartbeat for %d minutes: no relay is running (missing data counts as breaching).", p.HeartbeatMissingMinutes),
			RelayMetric(metrics.RelayHeartbeat, "Sum"), awscloudwatch.ComparisonOperator_LESS_THAN_THRESHOLD, 1, p.HeartbeatMissingMinutes, awscloudwatch.TreatMissingData_BREACHING)
		if fn := o.Relay(); fn != nil {
			lambdaAlarms("Relay", "Relay", fn)
		} else if svc := o.RelayService(); svc != nil {
			// The service's tasks restart on their own; fewer running than desired for 5 minutes
			// means they cannot start (image, role, network) or keep crashing.
			alarm("RelayServiceTasksMissing", "The relay's Fargate service runs fewer tasks than desired for 5 minutes (tasks cannot start or keep stopping).",
				awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
					Expression:   jsii.String("desired - running"),
					UsingMetrics: &map[string]awscloudwatch.IMetric{"desired": serviceMetric(svc, "DesiredTaskCount"), "running": serviceMetric(svc, "RunningTaskCount")},
					Period:       awscdk.Duration_Minutes(jsii.Number(1)),
				}), gt, 0, 5, awscloudwatch.TreatMissingData_BREACHING)
		}

		dash.AddWidgets(
			graph("Outbox oldest pending age (s)", []awscloudwatch.IMetric{age}, jsii.Number(p.OldestPendingAge.Seconds())),
			graph("Outbox pending and quarantined rows", []awscloudwatch.IMetric{RelayMetric(metrics.OutboxPending, "Maximum"), RelayMetric(metrics.OutboxQuarantined, "Maximum")}, nil),
			graph("Relay heartbeat", []awscloudwatch.IMetric{RelayMetric(metrics.RelayHeartbeat, "Sum")}, nil),
		)
		relayHealth := []awscloudwatch.IWidget{
			graph("Published and publish failures", []awscloudwatch.IMetric{RelayMetric(metrics.Published, "Sum"), RelayMetric(metrics.PublishFailures, "Sum")}, nil),
		}
		if fn := o.Relay(); fn != nil {
			relayHealth = append(relayHealth,
				graph("Relay errors and throttles", []awscloudwatch.IMetric{fn.MetricErrors(fiveMin), fn.MetricThrottles(fiveMin)}, nil),
				graph("Relay concurrent executions", []awscloudwatch.IMetric{fn.Metric(jsii.String("ConcurrentExecutions"), &awscloudwatch.MetricOptions{Statistic: jsii.String("Maximum")})}, nil))
		} else if svc := o.RelayService(); svc != nil {
			relayHealth = append(relayHealth,
				graph("Relay service tasks (desired, running)", []awscloudwatch.IMetric{serviceMetric(svc, "DesiredTaskCount"), serviceMetric(svc, "RunningTaskCount")}, nil),
				graph("Relay service CPU and memory (%)", []awscloudwatch.IMetric{svc.MetricCpuUtilization(nil), svc.MetricMemoryUtilization(nil)}, nil))
		}
		dash.AddWidgets(relayHealth...)
	}

	if f := p.Fleet; f != nil {
		// A fleet emits its tenants' figures (metrics.Tenant*), never the single relay's names.
		age := FleetRelayMetric(metrics.TenantOldestPendingAge, "Maximum")
		alarm("FleetOutboxOldestPendingAge", fmt.Sprintf("The oldest unpublished outbox row of a fleet tenant is older than %s: rows are committed but not published (the dashboard shows which tenant).", p.OldestPendingAge),
			age, gt, p.OldestPendingAge.Seconds(), 2, notBreaching)
		alarm("FleetOutboxQuarantined", "Quarantined outbox rows in a fleet tenant: they block their partition key until retried (sluice status --fleet names the tenant).",
			FleetRelayMetric(metrics.TenantQuarantined, "Maximum"), gt, 0, 1, notBreaching)
		alarm("FleetTenantsFailing", fmt.Sprintf("A fleet tenant has failed for %d minutes (unreachable, wrong password, broken schema): its rows are not published; the relay's log names it and its error.", p.FleetTenantsFailingMinutes),
			RelayMetric(metrics.FleetTenantsFailing, "Maximum"), gt, 0, p.FleetTenantsFailingMinutes, notBreaching)
		alarm("FleetHeartbeatMissing", fmt.Sprintf("No fleet relay has reported for %d minutes: no shard is running (missing data counts as breaching).", p.HeartbeatMissingMinutes),
			RelayMetric(metrics.FleetTenants, "SampleCount"), awscloudwatch.ComparisonOperator_LESS_THAN_THRESHOLD, 1, p.HeartbeatMissingMinutes, awscloudwatch.TreatMissingData_BREACHING)
		health := make([]awscloudwatch.IMetric, 0, 2*len(f.Relays()))
		for i, fn := range f.Relays() {
			lambdaAlarms(fmt.Sprintf("FleetShard%dRelay", i), fmt.Sprintf("Fleet relay shard %d", i), fn)
			health = append(health, fn.MetricErrors(fiveMin), fn.MetricThrottles(fiveMin))
		}
		byTenant := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression: jsii.String(fmt.Sprintf(`SEARCH('{%s,%s,%s} %s="%s" MetricName="%s"', 'Maximum', 60)`, metrics.Namespace, metrics.DimensionService, metrics.DimensionTenant,
				metrics.DimensionService, metrics.ServiceRelay, metrics.TenantOldestPendingAge.Name)),
			Label:  jsii.String(""),
			Period: awscdk.Duration_Minutes(jsii.Number(1)),
		})
		dash.AddWidgets(
			graph("Fleet oldest pending age, all tenants (s)", []awscloudwatch.IMetric{age}, jsii.Number(p.OldestPendingAge.Seconds())),
			graph("Fleet oldest pending age by tenant (s)", []awscloudwatch.IMetric{byTenant}, nil),
			graph("Fleet tenants and failing tenants", []awscloudwatch.IMetric{RelayMetric(metrics.FleetTenants, "Maximum"), RelayMetric(metrics.FleetTenantsFailing, "Maximum")}, nil),
			graph("Fleet relay errors and throttles", health, nil),
		)
	}

	for _, c := range p.Consumers {
		n := c.Name()
		visible := func(q interface {
			MetricApproximateNumberOfMessagesVisible(*awscloudwatch.MetricOptions) awscloudwatch.Metric
		}) awscloudwatch.Metric {
			return q.MetricApproximateNumberOfMessagesVisible(&awscloudwatch.MetricOptions{Period: awscdk.Duration_Minutes(jsii.Number(1)), Statistic: jsii.String("Maximum")})
		}
		// A Kinesis or MSK consumer has no queue: its backlog is the source's (sourceAlarms),
		// and its DLQ holds failure records.
		backlog := sourceAlarms(c, &p, func(key, description string, metric awscloudwatch.IMetric, threshold float64, periods int) {
			alarm(key, description, metric, gt, threshold, periods, notBreaching)
		})
		depths := []awscloudwatch.IMetric{visible(c.DeadLetterQueue())}
		alarm(n+"/DeadLetterQueueNotEmpty", fmt.Sprintf("Consumer %s: messages failed processing and are in the DLQ.", n),
			depths[0], gt, 0, 1, notBreaching)
		// The consumer's own record of the same: a record failed its source's last attempt and
		// is kept in inbox_dead_letter with its error and payload.
		alarm(n+"/DeadLetters", fmt.Sprintf("Consumer %s: records failed their source's last attempt and are kept as dead letters with their errors "+
			"(run sluice dead list --consumer %s; sluice dead retry --consumer %s applies them again once fixed).", n, n, n),
			ConsumerMetric(n, metrics.InboxDeadLetters, "Sum"), gt, 0, 1, notBreaching)
		var ageThreshold *float64
		if q := c.Queue(); q != nil {
			queueAge := q.MetricApproximateAgeOfOldestMessage(&awscloudwatch.MetricOptions{Period: awscdk.Duration_Minutes(jsii.Number(1)), Statistic: jsii.String("Maximum")})
			alarm(n+"/QueueOldestMessageAge", fmt.Sprintf("Consumer %s: the oldest queued message is older than %s.", n, p.QueueOldestMessageAge),
				queueAge, gt, p.QueueOldestMessageAge.Seconds(), 3, notBreaching)
			backlog, ageThreshold = append([]awscloudwatch.IMetric{queueAge}, backlog...), jsii.Number(p.QueueOldestMessageAge.Seconds())
		}
		if q := c.SubscriptionDeadLetterQueue(); q != nil {
			subDLQ := visible(q)
			alarm(n+"/SubscriptionDeadLetterQueueNotEmpty", fmt.Sprintf("Consumer %s: SNS (or the EventBridge rule) could not deliver messages to the queue.", n),
				subDLQ, gt, 0, 1, notBreaching)
			depths = append(depths, subDLQ)
		}
		lambdaAlarms(n+"/Consumer", "Consumer "+n, c.Function())
		if p.Migrations != nil && slices.Contains(p.Migrations.Audited(), n) {
			// The migrations function's scheduled audit: published events this consumer has not
			// applied long after their publication were lost between the topic and the inbox.
			missing := cloudWatchMetric(metrics.AuditMissingEvents, metrics.ServiceAudit, n, "Maximum").With(&awscloudwatch.MetricOptions{
				Period: awscdk.Duration_Hours(jsii.Number(1))})
			alarm(n+"/AuditMissingEvents", fmt.Sprintf("Consumer %s: published events were not applied long after their publication (sluice audit --consumer %s --since 2h names them).", n, n),
				missing, gt, 0, 1, notBreaching)
		}
		// The consumer's processor (the same function, on its schedule, in every commit mode: an
		// async consumer's messages, retried dead letters): its errors are the function's; a
		// parked row is one its handlers gave up on.
		alarm(n+"/InboxParked", fmt.Sprintf("Consumer %s: the inbox processor parked stored rows (async messages or retried dead letters) after their attempts (sluice dead list --consumer %s).", n, n),
			ProcessorMetric(n, metrics.InboxParked, "Sum"), gt, 0, 1, notBreaching)
		dash.AddWidgets(graph("Consumer "+n+": processor applied, failures, parked", []awscloudwatch.IMetric{
			ProcessorMetric(n, metrics.InboxProcessed, "Sum"), ProcessorMetric(n, metrics.InboxFailures, "Sum"), ProcessorMetric(n, metrics.InboxParked, "Sum"),
		}, nil))

		latency := func(stat string) awscloudwatch.IMetric { return ConsumerMetric(n, metrics.CommitToApplyLatency, stat) }
		dash.AddWidgets(
			graph("Consumer "+n+": commit-to-apply latency (ms)", []awscloudwatch.IMetric{latency("p50"), latency("p99"), latency("Maximum")}, nil),
			graph("Consumer "+n+": processed, duplicates, failures, dead letters", []awscloudwatch.IMetric{
				ConsumerMetric(n, metrics.InboxProcessed, "Sum"), ConsumerMetric(n, metrics.InboxDuplicates, "Sum"), ConsumerMetric(n, metrics.InboxFailures, "Sum"),
				ConsumerMetric(n, metrics.InboxDeadLetters, "Sum"),
			}, nil),
			graph("Consumer "+n+": backlog (queue oldest message age s, iterator age ms, offset lag, failed deliveries)", backlog, ageThreshold),
		)
		dash.AddWidgets(
			graph("Consumer "+n+": DLQ and subscription DLQ depth", depths, jsii.Number(0)),
			graph("Consumer "+n+": Lambda errors and throttles", []awscloudwatch.IMetric{c.Function().MetricErrors(fiveMin), c.Function().MetricThrottles(fiveMin)}, nil),
			graph("Consumer "+n+": Lambda duration p99 (ms)", []awscloudwatch.IMetric{c.Function().MetricDuration(&awscloudwatch.MetricOptions{Statistic: jsii.String("p99")})}, nil),
		)
	}

	if mig := p.Migrations; mig != nil {
		// The function answers CloudFormation's requests without failing (their outcome is the
		// deploy's), so its errors are the scheduled maintenance's. One-hour periods: the
		// schedule's, so a failing maintenance keeps the alarm raised until a run succeeds.
		hourly := &awscloudwatch.MetricOptions{Period: awscdk.Duration_Hours(jsii.Number(1)), Statistic: jsii.String("Sum")}
		alarm("PartitionMaintenanceErrors", "The scheduled partition maintenance (migrations function) failed: partitions are not created ahead or expired ones not dropped.",
			mig.Function().MetricErrors(hourly), gt, 0, 1, notBreaching)
	}

	if d := p.Database; d != nil {
		i := d.Instance
		lt := awscloudwatch.ComparisonOperator_LESS_THAN_THRESHOLD
		every := func(min float64, stat string) *awscloudwatch.MetricOptions {
			return &awscloudwatch.MetricOptions{Period: awscdk.Duration_Minutes(jsii.Number(min)), Statistic: jsii.String(stat)}
		}
		connections := d.MaxConnections * int(d.ConnectionsPercent) / 100
		alarm("DatabaseCPU", fmt.Sprintf("Database CPU above %g%% for 15 minutes.", d.CPUPercent),
			i.MetricCPUUtilization(every(5, "Average")), gt, d.CPUPercent, 3, notBreaching)
		alarm("DatabaseFreeableMemory", fmt.Sprintf("Database freeable memory below %.0f MiB for 15 minutes.", d.FreeableMemoryBytes/1024/1024),
			i.MetricFreeableMemory(every(5, "Minimum")), lt, d.FreeableMemoryBytes, 3, notBreaching)
		alarm("DatabaseFreeStorage", fmt.Sprintf("Database free storage below %.1f GiB.", d.FreeStorageBytes/1024/1024/1024),
			i.MetricFreeStorageSpace(every(5, "Minimum")), lt, d.FreeStorageBytes, 1, notBreaching)
		alarm("DatabaseConnections", fmt.Sprintf("Database connections above %g%% of max_connections %d (%d) for 5 minutes.", d.ConnectionsPercent, d.MaxConnections, connections),
			i.MetricDatabaseConnections(every(1, "Maximum")), gt, float64(connections), 5, notBreaching)
		alarm("DatabaseTransactionIDAge", fmt.Sprintf("The oldest unfrozen transaction ID is %.0f transactions old: vacuum is blocked (a long transaction, an abandoned replication slot or prepared transaction).", d.MaximumUsedTransactionIDs),
			i.Metric(jsii.String("MaximumUsedTransactionIDs"), every(5, "Maximum")), gt, d.MaximumUsedTransactionIDs, 1, notBreaching)
		if d.ReplicationSlotLagBytes > 0 {
			alarm("DatabaseReplicationSlotLag", fmt.Sprintf("A replication slot holds back more than %.0f MiB of WAL for 5 minutes: its reader stopped reading (docs/outbox.md, \"WAL wake-up\").", d.ReplicationSlotLagBytes/1024/1024),
				i.Metric(jsii.String("OldestReplicationSlotLag"), every(1, "Maximum")), gt, d.ReplicationSlotLagBytes, 5, notBreaching)
		}
		dash.AddWidgets(
			graph("Database CPU (%)", []awscloudwatch.IMetric{i.MetricCPUUtilization(every(5, "Average"))}, jsii.Number(d.CPUPercent)),
			graph("Database connections", []awscloudwatch.IMetric{i.MetricDatabaseConnections(every(1, "Maximum"))}, jsii.Number(float64(connections))),
			graph("Database transaction ID age", []awscloudwatch.IMetric{i.Metric(jsii.String("MaximumUsedTransactionIDs"), every(5, "Maximum"))}, jsii.Number(d.MaximumUsedTransactionIDs)),
		)
	}

	alarms := make([]interfacesawscloudwatch.IAlarmRef, 0, len(m.alarms))
	for _, k := range sortedKeys(m.alarms) {
		alarms = append(alarms, m.alarms[k])
	}
	dash.AddWidgets(awscloudwatch.NewAlarmStatusWidget(&awscloudwatch.AlarmStatusWidgetProps{
		Title: jsii.String("sluice alarms"), Alarms: &alarms, Width: jsii.Number(24),
	}))
	return m
}

func jsiiOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return jsii.String(s)
}

// serviceMetric is one of Container Insights' ECS service metrics (ECS/ContainerInsights), the
// maximum over a minute.
func serviceMetric(svc awsecs.FargateService, name string) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:  jsii.String("ECS/ContainerInsights"),
		MetricName: jsii.String(name),
		DimensionsMap: &map[string]*string{
			"ClusterName": svc.Cluster().ClusterName(),
			"ServiceName": svc.ServiceName(),
		},
		Statistic: jsii.String("Maximum"),
		Period:    awscdk.Duration_Minutes(jsii.Number(1)),
	})
}
